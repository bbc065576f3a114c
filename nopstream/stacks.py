"""Where a process waits: SIGUSR1 writes it to stderr (its log), one line per thread and asyncio task.

A job that does not end is diagnosed from outside (`nopstream chaos` on a timeout,
or a user with `kill -USR1`): each thread's innermost frames and each pending asyncio
task's chain of awaits, so a hang names the call it is stuck in. The process goes on.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

MARK = "where process"  # the first line of a dump: "where process PID waits:"
_FRAMES = 4  # innermost frames named per thread or task
_IDLE = {("thread.py", "_worker"), ("threading.py", "run")}  # an executor's idle worker; a thread in C code


def install() -> None:
    """Make SIGUSR1 write this process's waits to stderr (main thread only, as `signal` requires)."""
    signal.signal(signal.SIGUSR1, _on_signal)


def _on_signal(_signum: int, _frame: FrameType | None) -> None:
    dump()


def dump(loop: Any = None) -> None:
    """Write where each thread, and each task of `loop` (default: the calling thread's), waits to stderr."""
    lines = [f"{MARK} {os.getpid()} waits:"]
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        frames = [
            f
            for f in traceback.extract_stack(frame)
            if f.filename != __file__ and not f.filename.startswith("<frozen")  # the handler; imports
        ]
        if frames and (Path(frames[-1].filename).name, frames[-1].name) not in _IDLE:
            stack = [_where(f.filename, f.lineno or 0, f.name) for f in frames[-_FRAMES:]]
            lines.append(f"  thread {names.get(ident, ident)}: {' <- '.join(reversed(stack))}")
    asyncio = sys.modules.get("asyncio")  # not imported by this module: most commands never load it
    if loop is None and asyncio is not None:
        loop = asyncio._get_running_loop()
    for task in asyncio.all_tasks(loop) if asyncio is not None and loop is not None else ():
        lines.append(f"  task {task.get_name()}: {_chain(_awaits(task.get_coro()))}")
    print("\n".join(lines), file=sys.stderr, flush=True)


def _awaits(coro: Any) -> list[str]:
    """The frames of a coroutine and of what it awaits, outermost first."""
    found = []
    while coro is not None:
        frame = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "gi_frame", None)
            or getattr(coro, "ag_frame", None)
        )
        if frame is not None:
            found.append(_where(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "gi_yieldfrom", None)
            or getattr(coro, "ag_await", None)
        )
    return found


def _chain(frames: list[str]) -> str:
    """Innermost frames first, and the outermost too when cut: it names what the task runs for."""
    shown = " <- ".join(reversed(frames[-_FRAMES:]))
    return shown if len(frames) <= _FRAMES else f"{shown} <- ... <- {frames[0]}"


def _where(filename: str, line: int, function: str) -> str:
    return f"{Path(filename).name}:{line} {function}"
