"""PartitionedPlan: every subtask, shard owner, channel, split and state path of a job.

This is what the runtime executes; it never re-derives any of it. Channels are listed
explicitly: FORWARD joins subtask i to subtask i; UNION does too when parallelism is
equal and is all-to-all otherwise; SINGLETON joins every upstream subtask to subtask
0; HASH, REBALANCE and BROADCAST are all-to-all. One channel per subtask pair
(channelIndex 0). A channel's identity is `edgeId/upstream/downstream/channelIndex`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from nopstream.model.catalogue import SOURCE_TYPES
from nopstream.model.connectors import IndexedSourceConfig
from nopstream.plan.jobgraph import JobEdge, JobGraph, JobVertex
from nopstream.plan.keys import shard_range
from nopstream.plan.streamgraph import (
    FORMAT_VERSION,
    EdgePolicy,
    JobIdentity,
    KeySelector,
    StreamNode,
)

STATE_PATHS = {
    "keyed": "checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/{shard}/{stateName}",
    "operator": "checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/operator/{stateName}",
    "source": "checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/source/{splitId}",
    "sink": "checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/sink/{transactionId}",
    "manifest": "checkpoint/{ns}/{epoch}/_manifest.json",
}
"""StatePath templates of DESIGN.md section 2, relative to the checkpoint storage root."""


@dataclass(frozen=True)
class ShardRange:
    """A contiguous half-open range [start, end) of state shards."""

    start: int
    end: int

    def __contains__(self, shard: object) -> bool:
        return isinstance(shard, int) and self.start <= shard < self.end


@dataclass(frozen=True)
class Subtask:
    """One parallel instance of a vertex; a keyed vertex's subtask owns a shard range."""

    index: int
    task_id: str
    shards: ShardRange | None


@dataclass(frozen=True)
class Vertex:
    """A chain of operators with its parallelism and subtasks; keyed when fed by a HASH edge."""

    vertex_id: str
    parallelism: int
    keyed: bool
    operators: tuple[StreamNode, ...]
    subtasks: tuple[Subtask, ...]


class Channel(NamedTuple):
    """One ordered connection from an upstream subtask to a downstream subtask.

    A NamedTuple, not a dataclass: plans hold tens of thousands of them, and plan
    documents write each as `[upstream, downstream, index]`.
    """

    upstream: int
    downstream: int
    channel_index: int


@dataclass(frozen=True)
class Edge:
    """A vertex edge with its routing: policy, key, shard owners and channels."""

    edge_id: str
    source_vertex: str
    source_operator: str
    output: str
    target_vertex: str
    target_operator: str
    input_index: int
    policy: EdgePolicy
    key: KeySelector | None
    hash_policy: str | None
    shard_count: int | None
    owners: tuple[ShardRange, ...] | None
    channels: tuple[Channel, ...]

    def channel_id(self, channel: Channel) -> str:
        """The channel identity `edgeId/upstream/downstream/channelIndex`."""
        return f"{self.edge_id}/{channel.upstream}/{channel.downstream}/{channel.channel_index}"


@dataclass(frozen=True)
class SourceSplits:
    """How a source's splits reach its subtasks.

    `static`: the splits are known at compile time and listed in `assignment`
    (`assignment[i]` is the tuple of split ids of subtask i). `hash-mod`: splits are
    discovered while running and split `s` goes to subtask
    `stableHash(s) mod parallelism` under `hash_policy`.
    """

    operator_id: str
    vertex_id: str
    policy: str
    hash_policy: str | None
    assignment: tuple[tuple[str, ...], ...] | None


@dataclass(frozen=True)
class PartitionedPlan:
    """The executable plan: vertices, edges, ACK set, split assignment and state paths."""

    format_version: int
    identity: JobIdentity
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]
    ack_set: tuple[str, ...]
    sources: tuple[SourceSplits, ...]
    state_paths: dict[str, str]

    def vertex(self, vertex_id: str) -> Vertex:
        """The vertex with this id; KeyError when there is none."""
        for v in self.vertices:
            if v.vertex_id == vertex_id:
                return v
        raise KeyError(vertex_id)

    def operators(self) -> dict[str, StreamNode]:
        """Every operator (sources and sinks included) by id."""
        return {op.node_id: op for v in self.vertices for op in v.operators}

    def task_ids(self) -> tuple[str, ...]:
        """Every task id, in vertex then subtask order."""
        return tuple(s.task_id for v in self.vertices for s in v.subtasks)

    def source_task_ids(self) -> tuple[str, ...]:
        """The ids of the tasks whose chain starts with a source (where barriers are injected)."""
        return tuple(s.task_id for v in self.vertices if v.operators[0].kind == "source" for s in v.subtasks)


def task_id(identity: JobIdentity, vertex_id: str, subtask: int) -> str:
    """The task identity `jobId/pipelineId/vertexId/subtaskIndex`."""
    return f"{identity.job_id}/{identity.pipeline_id}/{vertex_id}/{subtask}"


def build_partitioned_plan(graph: JobGraph) -> PartitionedPlan:
    """Expand a JobGraph into subtasks, shard ranges, channels and split assignment."""
    ident = graph.identity
    hashed = {e.target_vertex for e in graph.edges if e.policy is EdgePolicy.HASH}
    vertices = tuple(_vertex(ident, v, keyed=v.vertex_id in hashed) for v in graph.vertices)
    by_id = {v.vertex_id: v for v in vertices}
    edges = tuple(_edge(ident, e, by_id[e.source_vertex], by_id[e.target_vertex]) for e in graph.edges)
    sources = tuple(_splits(ident, v, op) for v in vertices for op in v.operators if op.kind == "source")
    ack_set = tuple(sorted(s.task_id for v in vertices for s in v.subtasks))
    return PartitionedPlan(FORMAT_VERSION, ident, vertices, edges, ack_set, sources, dict(STATE_PATHS))


def _vertex(ident: JobIdentity, v: JobVertex, *, keyed: bool) -> Vertex:
    shards = ident.state_shard_count
    subtasks = tuple(
        Subtask(
            index=i,
            task_id=task_id(ident, v.vertex_id, i),
            shards=ShardRange(*shard_range(i, v.parallelism, shards)) if keyed else None,
        )
        for i in range(v.parallelism)
    )
    return Vertex(v.vertex_id, v.parallelism, keyed, v.chain, subtasks)


def _edge(ident: JobIdentity, e: JobEdge, up: Vertex, down: Vertex) -> Edge:
    hashed = e.policy is EdgePolicy.HASH
    return Edge(
        edge_id=e.edge_id,
        source_vertex=e.source_vertex,
        source_operator=e.source_node,
        output=e.output,
        target_vertex=e.target_vertex,
        target_operator=e.target_node,
        input_index=e.input_index,
        policy=e.policy,
        key=e.key,
        hash_policy=ident.hash_policy if hashed else None,
        shard_count=ident.state_shard_count if hashed else None,
        owners=tuple(s.shards for s in down.subtasks if s.shards is not None) if hashed else None,
        channels=_channels(e.policy, up.parallelism, down.parallelism),
    )


def _channels(policy: EdgePolicy, up: int, down: int) -> tuple[Channel, ...]:
    if policy is EdgePolicy.FORWARD or (policy is EdgePolicy.UNION and up == down):
        return tuple(Channel(i, i, 0) for i in range(up))
    if policy is EdgePolicy.SINGLETON:
        return tuple(Channel(i, 0, 0) for i in range(up))
    return tuple(Channel(i, j, 0) for i in range(up) for j in range(down))


def _splits(ident: JobIdentity, v: Vertex, op: StreamNode) -> SourceSplits:
    config_type = SOURCE_TYPES[op.type].config if op.type in SOURCE_TYPES else None
    if config_type is not None and issubclass(config_type, IndexedSourceConfig):  # `split-n` of `count`
        config = config_type.model_validate(op.spec.get("config", {}))
        count = config.splits or v.parallelism
        assignment = tuple(
            tuple(f"split-{s}" for s in range(count) if s % v.parallelism == i) for i in range(v.parallelism)
        )
        return SourceSplits(op.node_id, v.vertex_id, "static", None, assignment)
    return SourceSplits(op.node_id, v.vertex_id, "hash-mod", ident.hash_policy, None)
