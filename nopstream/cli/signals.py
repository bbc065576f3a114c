"""How the commands take SIGTERM: a local run unwinds as from Ctrl-C, a cluster job's process exits."""

from __future__ import annotations

import os
import sys
import threading


class Terminated(KeyboardInterrupt):
    """`nopstream run` got SIGTERM: it unwinds as from Ctrl-C, stopping its task processes (a
    KeyboardInterrupt, so that asyncio passes it through its task groups as it is)."""


def unwind_on_sigterm() -> None:
    """SIGTERM raises Terminated: the command stops its task processes and removes its run files
    (`control-url`, `secret`) as on Ctrl-C, instead of dying with them left behind."""
    import signal

    def stop(_signum: int, _frame: object) -> None:
        raise Terminated

    if threading.current_thread() is threading.main_thread():  # signals go to the main thread only
        signal.signal(signal.SIGTERM, stop)


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
