"""How a run is led, once for every way a job runs: one `EpochCoordinator` over the run's tasks.

The in-process runner (`nopstream run --in-process`), the local control server (`nopstream
run`) and each coordinator process (`nopstream coordinator`) lead a run the same way: a
coordinator numbering epochs from the run's restore point, its barriers and commits sent
through `Commands` (direct calls to tasks in the same process, or HTTP to task processes),
its routes (if any) taking the run's ACKs while it runs, and whatever else the run does
(its tasks, their supervision) beside it. Only how the leadership was won, how the tasks
are reached and what a predecessor left differ; those stay with each caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from nopstream.checkpoint.epochs import EpochCoordinator
from nopstream.checkpoint.restore import RestorePoint
from nopstream.checkpoint.storage import Storage
from nopstream.cluster.election import Leadership
from nopstream.cluster.epochlog import EpochLog, LeaderLog
from nopstream.node.view.jobview import JobHistory
from nopstream.node.wire.coordinator_api import CoordinatorRoutes
from nopstream.plan.deployment import CheckpointSettings
from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import PartitionedPlan


class Commands(Protocol):
    """How a run's leader reaches its tasks."""

    async def barrier(self, epoch: int, kind: EpochKind) -> None:
        """Ask every source task of the run to inject barrier `epoch` of `kind`."""

    async def commit(self, epoch: int) -> None:
        """Tell every task of the run that epochs up to `epoch` are durable (its sinks commit)."""


@dataclass(frozen=True)
class Leader:
    """What every run a leader leads shares: the job, its storage, its epoch log and the leadership."""

    plan: PartitionedPlan
    settings: CheckpointSettings
    storage: Storage
    epoch_log: EpochLog
    leadership: Leadership
    history: JobHistory | None = None

    def coordinator(
        self, run: int, point: RestorePoint, commands: Commands, *, first_epoch: int | None = None
    ) -> EpochCoordinator:
        """The coordinator of run `run`, restored from `point`, numbering epochs from `first_epoch`
        (the point's next epoch unless given); the history, if any, says who leads it."""
        if self.history is not None:
            self.history.led(run, self.leadership.token, self.leadership.candidate)
        return EpochCoordinator(
            self.plan,
            self.storage,
            LeaderLog(self.epoch_log, self.leadership),
            settings=self.settings,
            trigger=commands.barrier,
            notify=commands.commit,
            first_epoch=point.next_epoch if first_epoch is None else first_epoch,
            restored=point.epoch,
            finished=point.finished,
            run=run,
            history=self.history,
        )


async def lead_run(
    coordinator: EpochCoordinator,
    *,
    routes: CoordinatorRoutes | None = None,
    work: Coroutine[Any, Any, None] | None = None,
    idle: bool = False,
) -> None:
    """Drive the coordinator's epochs beside `work` until both end, its ACKs taken by `routes` meanwhile.

    When the coordinator stops the job at a savepoint (its output committed), `work` is
    cancelled: its tasks wait for nothing more. With `idle` (the run already stands at a
    stop savepoint) no epoch is taken. A manifest write still running when this ends,
    returns or is cancelled, is awaited (`EpochCoordinator.settle`) before it returns.
    """
    run = coordinator.run_number
    if routes is not None:
        routes.lead(coordinator, run, recoveries=run - 1)
    try:
        async with asyncio.TaskGroup() as group:
            working = group.create_task(work, name="tasks") if work is not None else None
            if not idle:
                await coordinator.run()
            if coordinator.stopped and working is not None:
                working.cancel()
    finally:
        if routes is not None:
            routes.lead(None, run, recoveries=run - 1)
        await coordinator.settle()
