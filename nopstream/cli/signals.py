"""How the commands take SIGTERM: a local run unwinds as from Ctrl-C, a cluster job's process exits."""

from __future__ import annotations

import os
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


def exit_on_sigterm(command: str) -> None:
    """Exit at once on SIGTERM, with the status its default action gives (143).

    A container's first process has no default signal actions: without a handler it
    would ignore SIGTERM and its pod would take the whole grace period to stop. Exiting
    without cleanup is what the default action does outside a container, and what a job
    recovers from anyway: its state is in its durable epochs, not in this process.
    """
    import signal

    def stop(signum: int, _frame: object) -> None:
        print(f"nopstream {command}: stopped by SIGTERM", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
