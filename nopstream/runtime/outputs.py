"""A subtask's sending side: each output edge's channels, partitioner and combiner, as the plan says.

An output of the chain (an operator's named output) goes on every edge that carries it:
split by the edge's partitioner over its channels, or, on an edge whose records travel
as partial accumulators (`runtime.combiner`), added to the edge's combiner and sent
when it is full or must be emptied (before a barrier, an idle mark, the end of input,
or the watermark that closes its windows).
"""

from __future__ import annotations

from dataclasses import dataclass

from nopstream.plan.partitioned import Edge, PartitionedPlan
from nopstream.records import Batch
from nopstream.runtime.combiner import AnyCombiner, Drained, combiner_for
from nopstream.runtime.frames import Frame
from nopstream.runtime.partitioners import Partitioner
from nopstream.runtime.taskports import TaskIO
from nopstream.runtime.transport import OutputChannel


@dataclass
class _OutputEdge:
    edge: Edge
    partitioner: Partitioner
    channels: dict[int, OutputChannel]
    combiner: AnyCombiner | None = None


class Outputs:
    """The output edges of one subtask; none until `connect`."""

    def __init__(
        self, plan: PartitionedPlan, vertex_id: str, subtask: int, *, combined: frozenset[str]
    ) -> None:
        """The outputs of subtask `subtask` of `vertex_id`; edges in `combined` carry partial accumulators."""
        self.plan = plan
        self.vertex_id = vertex_id
        self.subtask = subtask
        self.combined = combined
        self.edges: list[_OutputEdge] = []

    async def connect(self, io: TaskIO, *, combiner_keys: int) -> None:
        """Open every output channel through `io`; a combiner holds up to `combiner_keys` keys."""
        for edge in self.plan.edges:
            if edge.source_vertex != self.vertex_id:
                continue
            target = self.plan.vertex(edge.target_vertex)
            channels: dict[int, OutputChannel] = {}
            for ch in edge.channels:
                if ch.upstream == self.subtask:
                    task = target.subtasks[ch.downstream].task_id
                    channels[ch.downstream] = await io.output(edge.channel_id(ch), task)
            target_op = self.plan.operators()[edge.target_operator]
            combiner = None
            if edge.edge_id in self.combined:
                combiner = combiner_for(edge, target_op, limit=combiner_keys)
            partitioner = Partitioner(edge, sorted(channels), target_op)
            self.edges.append(_OutputEdge(edge, partitioner, channels, combiner))

    def channels(self) -> list[OutputChannel]:
        """Every output channel."""
        return [ch for out in self.edges for ch in out.channels.values()]

    async def emit(self, op_id: str, output: str, batch: Batch) -> None:
        """Send operator `op_id`'s `output` on every edge that carries it."""
        for out in self.edges:
            if out.edge.source_operator != op_id or out.edge.output != output:
                continue
            if out.combiner is not None:
                out.combiner.add(batch)
                if out.combiner.full:
                    await _send_partials(out, out.combiner.drain())
                continue
            for downstream, part in out.partitioner.split(batch):
                await out.channels[downstream].send(part)

    async def flush_combiners(self, closed_by: int | None = None) -> None:
        """Every combiner sends what it holds; with `closed_by`, what it holds of the windows that
        watermark closes."""
        for out in self.edges:
            if out.combiner is not None:
                c = out.combiner
                await _send_partials(out, c.drain() if closed_by is None else c.drain_closed(closed_by))

    async def send_all(self, frame: Frame) -> None:
        """Send `frame` on every output channel."""
        for channel in self.channels():
            await channel.send(frame)


async def _send_partials(out: _OutputEdge, drained: Drained) -> None:
    """Send a combiner's partials, each to its key's owner."""
    if drained.records:
        for downstream, part in out.partitioner.route(drained.keys, drained.records):
            await out.channels[downstream].send(part)
