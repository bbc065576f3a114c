"""The one recovery policy: what a failed task does to its job, wherever the job runs.

A task that fails or dies ends its run. A refused start (its restore point or a
connector refused) and a bad record (`errors.Refusal`, with its own exit codes) are the
same in every run and are not recovered. Any other failure
is a global recovery: the next run is recorded first (`advance`, so a crash half-way
leaves the new run to be finished, never the old one to be resumed), then it is told
(`record`), then the old run's task processes are stopped and the new run's started,
each restoring the run's restore point. The limit is a failure rate, as Flink's
`failure-rate` restart strategy: more than `RestartPolicy.max_failures` failures
within its window fail the job instead (`TooManyRecoveries`), so an unbounded job
survives any number of transient failures spread over its life. Failures in quick
succession wait before the new run starts, each twice as long as the one before (the
first not at all), so a dependency that restarts for a few seconds does not use up the
limit.

`nopstream run` (its task processes), the supervisor of `nopstream run --etcd` and the
operator (pods) each give the steps (`Steps`); the order, the count and the limit
are here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn, Protocol

from nopstream import errors
from nopstream.errors import RestoreRefused


def exit_refused(refused: RestoreRefused) -> NoReturn:
    """End a task process that cannot start, at once, with its refusal on stderr and its exit code.

    Nothing is left to clean up that matters (the lease expires, nothing was written),
    and going at once matters: a peer that sees this task's channels close would
    otherwise die of it first, and its plain failure would be taken for the cause.
    """
    refusal = errors.Refusal.of(refused)
    print(refusal.line(), file=sys.stderr, flush=True)
    os._exit(refusal.exit_code)


class TooManyRecoveries(RuntimeError):
    """A failure past the job's failure rate; the message names it and the count."""


@dataclass(frozen=True)
class RestartPolicy:
    """How many failures a job survives within a window, and how long a recovery waits."""

    max_failures: int = 10
    """Failures within `window_s` that the job recovers from; one more fails it."""
    window_s: float = 600.0
    backoff_s: float = 0.25
    """The wait before the second recovery within the window; it doubles with each failure after."""
    max_backoff_s: float = 10.0

    def delay(self, failures: int) -> float:
        """Seconds to wait before the run after the `failures`-th failure within the window."""
        if failures <= 1:
            return 0.0
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 2)))

    def wait(self, failures: Sequence[float], now: float) -> float:
        """Seconds before a recovery from a failure seen at `now` may begin, for a runner that cannot
        wait in place (the operator's passes): its delay counted from the failure before it; none
        for a failure past the limit (the job fails at once)."""
        recent = [t for t in failures if now - t < self.window_s]
        if not recent or len(recent) + 1 > self.max_failures:
            return 0.0
        return max(0.0, recent[-1] + self.delay(len(recent) + 1) - now)


@dataclass(frozen=True)
class Recovery:
    """One global recovery, as recorded."""

    failed_run: int
    run: int
    recoveries: int
    cause: str
    failures: tuple[float, ...] = ()
    """When the failures within the policy's window happened (this one last), by the caller's clock."""
    delay_s: float = 0.0

    @property
    def message(self) -> str:
        """`cause (run N -> M)`, and the wait before it when there is one."""
        wait = f", after {self.delay_s:g} s" if self.delay_s else ""
        return f"{self.cause} (run {self.failed_run} -> {self.run}{wait})"


class Steps(Protocol):
    """How one way of running a job carries out a recovery."""

    def advance(self, run: int) -> int:
        """Record the run after `run` before anything stops; the run now current."""

    def record(self, recovery: Recovery) -> None:
        """Tell of the recovery (a line on stderr, the StreamJob's status and an Event)."""

    def stop(self, run: int) -> None:
        """Stop the task processes of `run`."""

    def start(self, run: int, *, delay_s: float) -> None:
        """Start the task processes of `run` `delay_s` from now (or leave them to a later pass)."""


def recover(
    steps: Steps,
    *,
    run: int,
    recoveries: int,
    failures: Sequence[float],
    now: float,
    policy: RestartPolicy,
    cause: str,
) -> Recovery:
    """Recover from `cause` ending run `run` at `now`, after `recoveries` recoveries whose failures
    happened at `failures`; TooManyRecoveries past the policy's failure rate."""
    recent = (*(t for t in failures if now - t < policy.window_s), now)
    if len(recent) > policy.max_failures:
        raise TooManyRecoveries(
            f"{cause} ({len(recent)} failures within {policy.window_s:g} s; the limit is"
            f" {policy.max_failures}, after {recoveries} recoveries)"
        )
    delay = policy.delay(len(recent))
    recovery = Recovery(run, steps.advance(run), recoveries + 1, cause, recent, delay)
    steps.record(recovery)
    steps.stop(run)
    steps.start(recovery.run, delay_s=delay)
    return recovery
