"""How a local run takes SIGTERM: it unwinds as from Ctrl-C (a cluster job's process exits at once:
`node.process.exit_on_sigterm`)."""

from __future__ import annotations

import sys
import threading
from types import FrameType

_TERMINATED = threading.Event()


def unwind_on_sigterm() -> None:
    """SIGTERM unwinds the command as Ctrl-C does: it stops its task processes and removes its run files
    (`control-url`, `secret`) instead of dying with them left behind; `terminated()` then says so."""
    import signal

    def stop(_signum: int, frame: FrameType | None) -> None:
        _TERMINATED.set()
        interrupt = signal.getsignal(signal.SIGINT)
        if _loop_running() and callable(interrupt) and interrupt is not signal.default_int_handler:
            # asyncio.run's own Ctrl-C handler cancels its main task, which unwinds every task: an
            # exception raised here could land in any task's step and be left there unretrieved
            interrupt(signal.SIGINT, frame)
            return
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():  # signals go to the main thread only
        signal.signal(signal.SIGTERM, stop)


def terminated() -> bool:
    """Whether the KeyboardInterrupt being handled came from SIGTERM (`unwind_on_sigterm`), not Ctrl-C."""
    return _TERMINATED.is_set()


def _loop_running() -> bool:
    """Whether an asyncio event loop runs in this (the main) thread."""
    asyncio = sys.modules.get("asyncio")  # not imported here: a command without a loop never loads it
    try:
        return asyncio is not None and asyncio.get_running_loop() is not None
    except RuntimeError:
        return False
