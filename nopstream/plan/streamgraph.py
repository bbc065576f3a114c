"""StreamGraph: the logical DAG of a valid model, with each edge's policy chosen.

Edge policy rules, first match wins (docs/plan.md):
0. the edge enters an input a process names in `broadcast` -> BROADCAST
1. the edge leaves a key_by, or enters a keyed operator or a sink with `key`
   (or the input's own of `keys`)                          -> HASH
2. the edge enters a union                                -> UNION
3. the target asks for `partitioning: broadcast|rebalance|forward` -> that policy
4. the target has parallelism 1 and the source more       -> SINGLETON
5. equal parallelism                                      -> FORWARD
6. otherwise                                              -> REBALANCE
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nopstream.model.capabilities import SemanticMode
from nopstream.model.spec import KEYED_OPERATORS, KeySpec, OperatorSpec, SinkSpec, StreamModel
from nopstream.plan.keys import HASH_POLICY
from nopstream.plan.nodes import MAIN_OUTPUT, ResolvedNode, effective_key, resolve_nodes

FORMAT_VERSION = 1


class EdgePolicy(StrEnum):
    """How records of an edge are routed from upstream to downstream subtasks."""

    FORWARD = "FORWARD"
    HASH = "HASH"
    REBALANCE = "REBALANCE"
    BROADCAST = "BROADCAST"
    UNION = "UNION"
    SINGLETON = "SINGLETON"


@dataclass(frozen=True)
class JobIdentity:
    """The stable identities and job-wide settings every plan layer carries."""

    job_id: str
    pipeline_id: str
    checkpoint_namespace: str
    plan_version: int
    semantic_mode: SemanticMode
    state_shard_count: int
    hash_policy: str


@dataclass(frozen=True)
class KeySelector:
    """How a record's key is taken: a field, or a user function `module:attribute`."""

    field: str | None
    fn: str | None

    def describe(self) -> str:
        """The selector in words, e.g. `field 'word'`."""
        return f"field '{self.field}'" if self.field is not None else f"fn '{self.fn}'"


@dataclass(frozen=True)
class StreamNode:
    """One source, operator or sink with its resolved id, parallelism and canonical spec."""

    node_id: str
    kind: str
    type: str
    parallelism: int
    stateful: bool
    key: KeySelector | None
    spec: dict[str, Any]


@dataclass(frozen=True)
class StreamEdge:
    """One logical edge: from a node's output to an input slot of another node."""

    edge_id: str
    source: str
    output: str
    target: str
    input_index: int
    policy: EdgePolicy
    key: KeySelector | None


@dataclass(frozen=True)
class StreamGraph:
    """The logical DAG: nodes in model order, edges in target-then-input order."""

    format_version: int
    identity: JobIdentity
    nodes: tuple[StreamNode, ...]
    edges: tuple[StreamEdge, ...]


def identity_of(model: StreamModel, scope: str | None = None) -> JobIdentity:
    """The job identity of a validated model, with the namespace default applied.

    The default checkpoint namespace is `{jobId}/{pipelineId}`, under `scope` (the
    Kubernetes namespace) when given: two StreamJobs of one name in two Kubernetes
    namespaces never share state.
    """
    job_id = model.job_id or ""
    default = "/".join(p for p in (scope, job_id, model.pipeline_id) if p is not None)
    return JobIdentity(
        job_id=job_id,
        pipeline_id=model.pipeline_id,
        checkpoint_namespace=model.checkpoint_namespace or default,
        plan_version=model.plan_version,
        semantic_mode=model.semantic_mode,
        state_shard_count=model.state_shard_count,
        hash_policy=HASH_POLICY,
    )


def build_stream_graph(model: StreamModel, *, scope: str | None = None) -> StreamGraph:
    """The StreamGraph of a model that `validate` accepted (`scope`: see `identity_of`)."""
    nodes = resolve_nodes(model)
    by_id = {n.node_id: n for n in nodes}
    stream_nodes = tuple(_stream_node(n, by_id) for n in nodes)
    edges = []
    for n in nodes:
        for ref in n.inputs:
            upstream = by_id[ref.node_id]
            policy, key = _edge_policy(upstream, n, ref.position)
            edge_id = f"{ref.node_id}->{n.node_id}"
            if ref.output != MAIN_OUTPUT:
                edge_id = f"{ref.node_id}:{ref.output}->{n.node_id}"
            edges.append(StreamEdge(edge_id, ref.node_id, ref.output, n.node_id, ref.position, policy, key))
    return StreamGraph(FORMAT_VERSION, identity_of(model, scope), stream_nodes, tuple(edges))


def _selector(key: KeySpec | None) -> KeySelector | None:
    return None if key is None else KeySelector(key.field, key.fn)


def _stream_node(n: ResolvedNode, by_id: dict[str, ResolvedNode]) -> StreamNode:
    spec = n.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec.update(id=n.node_id, parallelism=n.parallelism)
    if n.kind != "source":
        spec["inputs"] = [
            ref.node_id if ref.output == MAIN_OUTPUT else f"{ref.node_id}:{ref.output}" for ref in n.inputs
        ]
    keyed = n.kind == "operator" and n.type in KEYED_OPERATORS
    return StreamNode(
        node_id=n.node_id,
        kind=n.kind,
        type=n.type,
        parallelism=n.parallelism,
        stateful=keyed or n.kind != "operator",
        key=_selector(effective_key(n, by_id)) if keyed else None,
        spec=spec,
    )


def _edge_policy(
    up: ResolvedNode, down: ResolvedNode, position: int
) -> tuple[EdgePolicy, KeySelector | None]:
    """The policy and key of the edge from `up` into input `position` of `down`."""
    own_key = None
    if (
        isinstance(down.spec, OperatorSpec)
        and down.spec.inputs
        and down.spec.inputs[position] in (down.spec.broadcast or ())
    ):
        return EdgePolicy.BROADCAST, None
    if isinstance(down.spec, SinkSpec):
        own_key = down.spec.key
    elif isinstance(down.spec, OperatorSpec) and down.type != "key_by":
        own_key = down.spec.keys[position] if down.spec.keys else down.spec.key
    if own_key is not None:
        return EdgePolicy.HASH, _selector(own_key)
    if up.kind == "operator" and up.type == "key_by" and isinstance(up.spec, OperatorSpec):
        return EdgePolicy.HASH, _selector(up.spec.key)
    if down.type == "union" and down.kind == "operator":
        return EdgePolicy.UNION, None
    hint = down.spec.partitioning if isinstance(down.spec, (OperatorSpec, SinkSpec)) else None
    if hint is not None:
        return EdgePolicy(hint.upper()), None
    if down.parallelism == 1 and up.parallelism > 1:
        return EdgePolicy.SINGLETON, None
    if down.parallelism == up.parallelism:
        return EdgePolicy.FORWARD, None
    return EdgePolicy.REBALANCE, None
