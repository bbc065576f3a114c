"""What a task is connected to: its transport (`TaskIO`) and its checkpointing side (`TaskListener`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.records import TaskSnapshot
from nopstream.runtime.gate import InputChannel, InputGate
from nopstream.runtime.transport import OutputChannel

if TYPE_CHECKING:
    from nopstream.runtime.task import Task


class TaskIO(Protocol):
    """A transport bound to one task: its input channels and output channels."""

    def input(
        self, gate: InputGate, channel_id: str, *, edge_id: str, input_index: int, upstream: int
    ) -> InputChannel:
        """Register the receiving end of a channel in the task's gate."""
        ...

    async def output(self, channel_id: str, downstream_task: str) -> OutputChannel:
        """Open the sending end of a channel to a downstream task."""
        ...


class TaskListener(Protocol):
    """The checkpointing side of a task: where snapshots go, who learns that sources ended.

    With a listener, a source that has read everything waits for the final barrier
    before it ends its outputs, and a sink task waits for the final epoch's commit
    before it finishes: every output is bound to a durable epoch. Without one (tests
    of the runtime alone), sinks publish what they hold at end of input.
    """

    async def on_snapshot(self, task: Task, epoch: int, kind: EpochKind, state: TaskSnapshot) -> None:
        """The task snapshotted its chain at barrier `epoch` (state is a private copy).

        Called in the background, after the barrier went on, one epoch at a time in
        order: the next epoch's call starts when this one has returned.
        """
        ...

    async def on_source_finished(self, task: Task) -> None:
        """A source task has read all its input and waits for the final barrier."""
        ...


def input_channels(
    plan: PartitionedPlan, vertex_id: str, subtask: int, io: TaskIO, gate: InputGate
) -> list[str]:
    """Register every input channel of the subtask in its gate; their ids."""
    inputs = []
    for edge in plan.edges:
        if edge.target_vertex != vertex_id:
            continue
        for ch in edge.channels:
            if ch.downstream == subtask:
                cid = edge.channel_id(ch)
                inputs.append(cid)
                io.input(gate, cid, edge_id=edge.edge_id, input_index=edge.input_index, upstream=ch.upstream)
    return inputs
