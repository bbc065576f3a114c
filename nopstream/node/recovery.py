"""The one recovery policy: what a failed task does to its job, wherever the job runs.

A task that fails or dies ends its run. A refused start (`EXIT_REFUSED`,
`EXIT_START_REFUSED`: its restore point or a connector refused) is the same in every
run and is not recovered. Any other failure is a global recovery: the next run is
recorded first (`advance`, so a crash half-way leaves the new run to be finished, never
the old one to be resumed), then it is told (`record`), then the old run's task
processes are stopped and the new run's started, each restoring the run's restore
point. Past `limit` recoveries the job fails instead (`TooManyRecoveries`).

`nopstream run` (its task processes), the supervisor of `nopstream run --etcd` and the
operator (pods) each give the steps (`Steps`); the order, the count and the limit
are here.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import NoReturn, Protocol

from nopstream.errors import RestoreRefused, StartRefused

EXIT_REFUSED = 4
"""The exit code of a task whose run cannot start (its restore was refused): not recovered."""
EXIT_START_REFUSED = 5
"""The exit code of a task whose connector cannot start as configured: not recovered."""
REFUSALS = (EXIT_REFUSED, EXIT_START_REFUSED)


REFUSAL = "nopstream task: cannot start: "
"""How the last line of a refused task process's stderr begins."""


def exit_refused(refused: RestoreRefused) -> NoReturn:
    """End a task process that cannot start, at once, with its refusal on stderr and its exit code.

    Nothing is left to clean up that matters (the lease expires, nothing was written),
    and going at once matters: a peer that sees this task's channels close would
    otherwise die of it first, and its plain failure would be taken for the cause.
    """
    print(f"{REFUSAL}{refused}", file=sys.stderr, flush=True)
    os._exit(EXIT_START_REFUSED if isinstance(refused, StartRefused) else EXIT_REFUSED)


class TooManyRecoveries(RuntimeError):
    """A failure past the job's recovery limit; the message names it and the count."""


@dataclass(frozen=True)
class Recovery:
    """One global recovery, as recorded."""

    failed_run: int
    run: int
    recoveries: int
    cause: str

    @property
    def message(self) -> str:
        """`cause (run N -> M)`."""
        return f"{self.cause} (run {self.failed_run} -> {self.run})"


class Steps(Protocol):
    """How one way of running a job carries out a recovery."""

    def advance(self, run: int) -> int:
        """Record the run after `run` before anything stops; the run now current."""

    def record(self, recovery: Recovery) -> None:
        """Tell of the recovery (a line on stderr, the StreamJob's status and an Event)."""

    def stop(self, run: int) -> None:
        """Stop the task processes of `run`."""

    def start(self, run: int) -> None:
        """Start the task processes of `run` (or leave them to the next pass)."""


def recover(steps: Steps, *, run: int, recoveries: int, limit: int, cause: str) -> Recovery:
    """Recover from `cause` ending run `run` after `recoveries` recoveries; TooManyRecoveries past `limit`."""
    if recoveries >= limit:
        raise TooManyRecoveries(f"{cause} (after {recoveries} recoveries)")
    recovery = Recovery(run, steps.advance(run), recoveries + 1, cause)
    steps.record(recovery)
    steps.stop(run)
    steps.start(recovery.run)
    return recovery
