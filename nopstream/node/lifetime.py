"""How a child process ends with the process that started it (Linux's parent-death signal), and how a
forked child ends at all (`end_forked`)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

LEFT_TASKS_GRACE_S = 5.0
"""How long the asyncio tasks a task process's main coroutine left get to end once cancelled."""

_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
"""prctl(2), looked up when this module is imported: a lookup (dlsym) in a child forked from
a threaded process can wait forever on a lock another thread of the parent held at the fork."""


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` dies; exit at once if it died already."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def end_forked(body: Callable[[], object]) -> NoReturn:
    """Run `body` in a forked child, then end the child: 0 when it returns, a SystemExit's code, 1
    after printing anything else it raised; never back into the code the parent forked from."""
    code = 1
    try:
        body()
        code = 0
    except SystemExit as leaving:
        code = leaving.code if isinstance(leaving.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_to_end(main: Coroutine[Any, Any, T], *, grace_s: float = LEFT_TASKS_GRACE_S) -> T:
    """`main`'s result, run on a new event loop as `asyncio.run` runs it, but for its end: the tasks
    it left are cancelled and get `grace_s` to end, then are left to the process's exit.

    For a process that ends once `main` returns (a task process): a task that swallows its
    cancellation (a connection pool's worker whose connection attempt took it for a failure, a
    user's `while True` around an await) holds `asyncio.run`'s end, and the process, forever.
    """
    import asyncio

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=grace_s))
        for task in left:  # as asyncio.run says them: the process ends without collecting them
            if task.done() and not task.cancelled() and task.exception() is not None:
                loop.call_exception_handler(
                    {
                        "message": "a task failed as the process ended",
                        "exception": task.exception(),
                        "task": task,
                    }
                )
        shutdown = loop.create_task(loop.shutdown_asyncgens())
        loop.run_until_complete(asyncio.wait([shutdown], timeout=grace_s))
