"""Every task of a plan in one process, over `local` channels (`nopstream run --in-process`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nopstream import errors
from nopstream.connectors.registry import Connectors
from nopstream.errors import RestoreRefused
from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.records import ConnectorFactory
from nopstream.runtime.gate import InputChannel, InputGate
from nopstream.runtime.pacing import TaskSettings
from nopstream.runtime.task import Task
from nopstream.runtime.taskports import TaskListener
from nopstream.runtime.transport import LocalNetwork, LocalOutput, TransportSettings


class _LocalIO:
    """TaskIO over one shared LocalNetwork."""

    def __init__(self, network: LocalNetwork) -> None:
        self.network = network

    def input(
        self, gate: InputGate, channel_id: str, *, edge_id: str, input_index: int, upstream: int
    ) -> InputChannel:
        return self.network.input(
            gate, channel_id, edge_id=edge_id, input_index=input_index, upstream=upstream
        )

    async def output(self, channel_id: str, downstream_task: str) -> LocalOutput:
        return self.network.output(channel_id)


def build_tasks(
    plan: PartitionedPlan,
    *,
    connectors: ConnectorFactory | None = None,
    listener: TaskListener | None = None,
    settings: TaskSettings | None = None,
    transport: TransportSettings | None = None,
    clock: Callable[[], int] | None = None,
) -> list[Task]:
    """One Task per subtask of the plan, joined by a LocalNetwork."""
    network = LocalNetwork(transport) if transport is not None else LocalNetwork()
    io = _LocalIO(network)
    factory = connectors or Connectors(plan.identity)
    extra: dict[str, Any] = {"clock": clock} if clock is not None else {}
    return [
        Task(
            plan,
            v.vertex_id,
            s.index,
            io=io,
            connectors=factory,
            listener=listener,
            settings=settings,
            **extra,
        )
        for v in plan.vertices
        for s in v.subtasks
    ]


class DirectCommands:
    """`node.leading.Commands` by direct calls to the tasks of this process (added once built)."""

    def __init__(self) -> None:
        """Command no task yet: `tasks` is filled once they are built."""
        self.tasks: list[Task] = []

    async def barrier(self, epoch: int, kind: EpochKind) -> None:
        """Inject barrier `epoch` of `kind` at every source task."""
        for task in self.tasks:
            if task.source is not None:
                task.trigger_barrier(epoch, kind)

    async def commit(self, epoch: int) -> None:
        """Commit every task's sinks up to `epoch`."""
        await asyncio.gather(*(task.commit(epoch) for task in self.tasks))


class TaskFailed(Exception):
    """A task of an in-process run raised; carries its id and traceback."""

    def __init__(self, task_id: str, error: BaseException) -> None:
        """Wrap `error`, raised by task `task_id`."""
        self.task_id = task_id
        self.trace = str(errors.failure_report(error)["error"])
        super().__init__(f"task {task_id} failed:\n{self.trace.rstrip()}")


async def _run_one(task: Task) -> None:
    try:
        await task.run()
    except RestoreRefused as refused:  # a bad record: its own line, as from a task process
        raise type(refused)(f"task {task.task_id}: {refused}") from None
    except Exception as error:
        raise TaskFailed(task.task_id, error) from error


async def run_tasks(tasks: list[Task]) -> None:
    """Connect and run every task; the first failure cancels the others and is raised as TaskFailed
    (a refusal, a bad record, as itself)."""
    for task in tasks:
        await task.connect()
    try:
        async with asyncio.TaskGroup() as group:
            for task in tasks:
                group.create_task(_run_one(task), name=task.task_id)
    except* (TaskFailed, RestoreRefused) as failures:
        raise failures.exceptions[0] from None
