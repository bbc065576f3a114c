"""JobGraph: FORWARD chains of the StreamGraph fused into vertices.

Chaining rule (docs/plan.md): an edge A -> B is fused when its policy is FORWARD
(hence equal parallelism), it leaves A's main output, it is A's only outgoing edge
and B's only incoming edge. A vertex is named after its chain head, so inserting a
stateless operator inside a chain keeps every vertex id.
"""

from __future__ import annotations

from dataclasses import dataclass

from nopstream.plan.nodes import MAIN_OUTPUT
from nopstream.plan.streamgraph import (
    FORMAT_VERSION,
    EdgePolicy,
    JobIdentity,
    KeySelector,
    StreamEdge,
    StreamGraph,
    StreamNode,
)


@dataclass(frozen=True)
class JobVertex:
    """A chain of nodes run together by each subtask of one vertex."""

    vertex_id: str
    parallelism: int
    chain: tuple[StreamNode, ...]


@dataclass(frozen=True)
class JobEdge:
    """A StreamGraph edge between two vertices (edges inside a chain vanish)."""

    edge_id: str
    source_vertex: str
    source_node: str
    output: str
    target_vertex: str
    target_node: str
    input_index: int
    policy: EdgePolicy
    key: KeySelector | None


@dataclass(frozen=True)
class JobGraph:
    """Vertices in topological order of their heads, and the edges between them."""

    format_version: int
    identity: JobIdentity
    vertices: tuple[JobVertex, ...]
    edges: tuple[JobEdge, ...]


def is_chained(edge: StreamEdge, outgoing: dict[str, int], incoming: dict[str, int]) -> bool:
    """Whether an edge is fused into a chain by the chaining rule."""
    return (
        edge.policy is EdgePolicy.FORWARD
        and edge.output == MAIN_OUTPUT
        and outgoing[edge.source] == 1
        and incoming[edge.target] == 1
    )


def build_job_graph(graph: StreamGraph) -> JobGraph:
    """Fuse the FORWARD chains of a StreamGraph into vertices."""
    outgoing = {n.node_id: 0 for n in graph.nodes}
    incoming = {n.node_id: 0 for n in graph.nodes}
    for e in graph.edges:
        outgoing[e.source] += 1
        incoming[e.target] += 1
    next_in_chain: dict[str, str] = {}
    chained_targets: set[str] = set()
    for e in graph.edges:
        if is_chained(e, outgoing, incoming):
            next_in_chain[e.source] = e.target
            chained_targets.add(e.target)
    by_id = {n.node_id: n for n in graph.nodes}
    vertex_of: dict[str, str] = {}
    vertices = []
    for head in _topological(graph):
        if head.node_id in chained_targets:
            continue
        chain = [head]
        while chain[-1].node_id in next_in_chain:
            chain.append(by_id[next_in_chain[chain[-1].node_id]])
        for node in chain:
            vertex_of[node.node_id] = head.node_id
        vertices.append(JobVertex(head.node_id, head.parallelism, tuple(chain)))
    edges = tuple(
        JobEdge(
            edge_id=e.edge_id,
            source_vertex=vertex_of[e.source],
            source_node=e.source,
            output=e.output,
            target_vertex=vertex_of[e.target],
            target_node=e.target,
            input_index=e.input_index,
            policy=e.policy,
            key=e.key,
        )
        for e in graph.edges
        if not is_chained(e, outgoing, incoming)
    )
    return JobGraph(FORMAT_VERSION, graph.identity, tuple(vertices), edges)


def _topological(graph: StreamGraph) -> list[StreamNode]:
    """Nodes in a deterministic topological order (Kahn's algorithm, model order on ties)."""
    order = {n.node_id: i for i, n in enumerate(graph.nodes)}
    pending = {n.node_id: 0 for n in graph.nodes}
    downstream: dict[str, list[str]] = {n.node_id: [] for n in graph.nodes}
    for e in graph.edges:
        pending[e.target] += 1
        downstream[e.source].append(e.target)
    by_id = {n.node_id: n for n in graph.nodes}
    ready = sorted((nid for nid, c in pending.items() if c == 0), key=order.__getitem__)
    result = []
    while ready:
        nid = ready.pop(0)
        result.append(by_id[nid])
        for t in downstream[nid]:
            pending[t] -= 1
            if pending[t] == 0:
                ready.append(t)
        ready.sort(key=order.__getitem__)
    return result
