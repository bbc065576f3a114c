"""A task pod kept across runs (NOPSTREAM_RESIDENT): its first process forks a task process per run.

A global recovery keeps the task pods that still run (docs/operator.md, "global recovery"):
a new pod per task per run costs a sandbox, a container and a Python start, seconds
on a busy node. The pod's first process (`host`) imports everything once, holds no
thread, event loop or connection (gRPC and asyncio do not survive a fork), and forks
a task process (`node.task.serve`) for each run the pod serves. A task process ends
when its run moves on (`RUN_OVER`, at once: `run_over`) or when it fails. The next one
reports its predecessor's failure in etcd (`Registry.report_failed`: the operator
recovers the job from that report as from a failed pod, and keeps this pod), then
waits, its port answering the probes, until a run hands it the task
(`Registry.next_to_serve`). The pod ends with the exit code of a task process that
finished the job (0), was not handed the next run (0), was refused (the same in every
run), or failed before it served any run; each task process dies with the host.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from nopstream.errors import REFUSED_EXITS
from nopstream.node import lifetime

log = logging.getLogger(__name__)
RUN_OVER = 75
"""A task process's exit code when its run moved on while it served it (EX_TEMPFAIL)."""


@dataclass(frozen=True)
class Start:
    """What a task process is told when it starts: the run its predecessor in the pod served (0: none),
    that predecessor's exit code when it failed, and the pipe on which it says which run it serves."""

    after: int = 0
    failed: int | None = None
    announce: int | None = None

    def began(self, run: int) -> None:
        """Tell the host that this process serves `run` (a process of its own tells no one)."""
        if self.announce is not None:
            os.write(self.announce, f"{run}\n".encode())


def host(child: Callable[[Start], NoReturn]) -> int:
    """Fork `child` for each run this pod serves, each after the one before ended; the pod's exit code."""
    start, me = Start(), os.getpid()
    while True:
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _child(child, dataclasses.replace(start, announce=write), me)
        os.close(write)
        code = _reap(pid)
        with os.fdopen(read) as announced:
            runs = [int(line) for line in announced.read().split()]
        if not runs or code == 0 or code in REFUSED_EXITS:
            return code
        if code == RUN_OVER:
            start = Start(after=runs[-1])
            continue
        log.warning(
            "the task process of run %d failed (exit code %d): the pod waits for the next run", runs[-1], code
        )
        start = Start(after=runs[-1], failed=code)


def run_over(run: int, current: int) -> NoReturn:
    """End this task process now: its run is over and the host forks the next (crash-only: a
    recovery discards what the run held, as when its pod is deleted)."""
    log.info("run %d is over (run %d is current): this task process ends", run, current)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RUN_OVER)


def _child(child: Callable[[Start], NoReturn], start: Start, host_pid: int) -> NoReturn:
    """The forked side: never returns into the host's loop, whatever `child` raises."""

    def serve() -> None:
        gc.freeze()  # what the host holds stays shared with it, never collected here
        lifetime.die_with_parent(host_pid)
        child(start)

    lifetime.end_forked(serve)


def _reap(pid: int) -> int:
    """Wait for child `pid` (reaping any orphan the host inherited as the pod's first process); its
    exit code, 128 + the signal's number when a signal ended it."""
    while True:
        done, status = os.wait()
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
