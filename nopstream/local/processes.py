"""Task processes of the local runner, forked from it so they start without re-importing.

The runner forks every task process before it starts its own event loop; each child
runs `worker.serve` in a fresh event loop and leaves with `os._exit`. They are real
OS processes with their own PIDs, stopped by PID (SIGTERM, then SIGKILL).
WARNING: fork only from a process with no running event loop and no other threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import setproctitle  # here, in the process that forks: in each child its import took 15-50 ms CPU

from nopstream.local import worker
from nopstream.local.children import Child
from nopstream.node import cpu, lifetime

_STOPS = {signal.SIGTERM, signal.SIGINT}


def fork_task(settings: worker.WorkerSettings, log: Path, *, close_fds: tuple[int, ...] = ()) -> Child:
    """Fork a process that runs one task; its stderr goes to `log` (created before the fork)."""
    # the parent creates the log: a child killed before its first instruction still has one
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    # SIGTERM and SIGINT wait while the child takes back their default actions: the
    # runner's own handlers (`nopstream run` unwinds on SIGTERM) must never run in a task
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    runner = os.getpid()
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        os.close(out)
        return Child(settings.task_id, pid, log)
    for stop in _STOPS:
        signal.signal(stop, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    # Everything inherited is the runner's: the child's collector must never free it. A
    # client library's object freed here acts on threads that exist only in the runner
    # (a Kafka consumer so freed segfaults: librdkafka is not fork-safe).
    gc.freeze()

    def serve() -> None:
        name_process(f"nopstream task {settings.task_id}")
        lifetime.die_with_parent(runner)  # a killed runner leaves no task behind
        for fd in close_fds:
            os.close(fd)
        os.dup2(out, 2)
        sys.stderr = sys.__stderr__  # fd 2, even where the runner's caller had replaced sys.stderr
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True
        )
        cpu.ask_for_long_turns()  # after logging: a refused request says so in the task's log
        lifetime.run_to_end(worker.serve(settings))

    lifetime.end_forked(serve)


@contextlib.contextmanager
def waking_on_exit(procs: list[Child], wake: Callable[[], None]) -> Iterator[None]:
    """Inside, `wake()` is called as soon as one of `procs` exits (a pidfd each in the running loop).

    Without it a supervisor polling exit codes learns of an exit only at its next
    poll. Where pidfds do not exist (Linux before 5.3), nothing wakes it early.
    """
    loop = asyncio.get_running_loop()
    watched: list[int] = []

    def exited(fd: int) -> None:
        loop.remove_reader(fd)  # an exited process's pidfd stays readable: once is enough
        wake()

    try:
        for proc in procs:
            try:
                fd = os.pidfd_open(proc.pid)
            except (AttributeError, OSError):  # no pidfd on this system, or the process is reaped
                continue
            watched.append(fd)
            loop.add_reader(fd, exited, fd)
        yield
    finally:
        for fd in watched:
            loop.remove_reader(fd)
            os.close(fd)


def name_process(title: str) -> None:
    """Show this process as `title` in `ps` and `top` (its command line and its name)."""
    setproctitle.setproctitle(title)
