"""Differences between two plans of the same layer, in sentences a person can read.

For PartitionedPlans the diff speaks of vertices, chains, parallelism, shard
ownership, edges, policies and channels; for the other layers it walks the plain
data and names each changed field by its path, with lists of identified items
(vertices, nodes, edges, tasks) matched by their id.
"""

from __future__ import annotations

from typing import Any

from nopstream.plan.canonical import to_plain
from nopstream.plan.compiler import Plan
from nopstream.plan.partitioned import Edge, PartitionedPlan, Vertex

_ID_FIELDS = ("taskId", "edgeId", "nodeId", "operatorId", "vertexId")  # most specific first


def diff(old: Plan, new: Plan) -> list[str]:
    """Every difference between two plans of one layer; empty when they are equal."""
    if type(old) is not type(new):
        raise TypeError(f"cannot diff {type(old).__name__} with {type(new).__name__}")
    if isinstance(old, PartitionedPlan) and isinstance(new, PartitionedPlan):
        return diff_partitioned(old, new)
    return _diff_plain("", to_plain(old), to_plain(new))


def diff_partitioned(old: PartitionedPlan, new: PartitionedPlan) -> list[str]:
    """The differences of two PartitionedPlans in words."""
    out = [f"job {line}" for line in _diff_plain("", to_plain(old.identity), to_plain(new.identity))]
    old_v = {v.vertex_id: v for v in old.vertices}
    new_v = {v.vertex_id: v for v in new.vertices}
    for vid, v in new_v.items():
        if vid not in old_v:
            out.append(f"vertex '{vid}' added: parallelism {v.parallelism}, chain [{_chain(v)}]")
    for vid in old_v:
        if vid not in new_v:
            out.append(f"vertex '{vid}' removed")
    for vid, v in new_v.items():
        if vid in old_v:
            out.extend(_diff_vertex(old_v[vid], v))
    old_e = {e.edge_id: e for e in old.edges}
    new_e = {e.edge_id: e for e in new.edges}
    for eid, e in new_e.items():
        if eid not in old_e:
            out.append(f"edge '{eid}' added: {e.policy.value}, {len(e.channels)} channels")
    for eid in old_e:
        if eid not in new_e:
            out.append(f"edge '{eid}' removed")
    for eid, e in new_e.items():
        if eid in old_e:
            out.extend(_diff_edge(old_e[eid], e))
    return out


def _chain(v: Vertex) -> str:
    return ", ".join(op.node_id for op in v.operators)


def _diff_vertex(old: Vertex, new: Vertex) -> list[str]:
    out = []
    name = f"vertex '{new.vertex_id}'"
    if old.parallelism != new.parallelism:
        out.append(f"{name}: parallelism {old.parallelism} -> {new.parallelism}")
    if _chain(old) != _chain(new):
        out.append(f"{name}: chain [{_chain(old)}] -> [{_chain(new)}]")
    old_ops = {op.node_id: op for op in old.operators}
    for op in new.operators:
        before = old_ops.get(op.node_id)
        if before is not None and before != op:
            changed = _diff_plain("", to_plain(before), to_plain(op))
            out.extend(f"operator '{op.node_id}': {line}" for line in changed if "parallelism" not in line)
    old_shards = [s.shards for s in old.subtasks]
    new_shards = [s.shards for s in new.subtasks]
    if old_shards != new_shards and any(new_shards):
        for i, shards in enumerate(new_shards):
            before_range = old_shards[i] if i < len(old_shards) else None
            if shards != before_range and shards is not None:
                was = f"[{before_range.start}, {before_range.end})" if before_range else "none"
                out.append(f"{name}: subtask {i} owns shards [{shards.start}, {shards.end}) (was {was})")
        for i in range(len(new_shards), len(old_shards)):
            out.append(f"{name}: subtask {i} removed; its shards move to the subtasks above")
    return out


def _diff_edge(old: Edge, new: Edge) -> list[str]:
    out = []
    name = f"edge '{new.edge_id}'"
    if old.policy != new.policy:
        out.append(f"{name}: policy {old.policy.value} -> {new.policy.value}")
    if old.key != new.key:
        was = old.key.describe() if old.key else "none"
        now = new.key.describe() if new.key else "none"
        out.append(f"{name}: key {was} -> {now}")
    if len(old.channels) != len(new.channels):
        out.append(f"{name}: channels {len(old.channels)} -> {len(new.channels)}")
    if (old.source_vertex, old.target_vertex) != (new.source_vertex, new.target_vertex):
        out.append(
            f"{name}: joins {old.source_vertex} -> {old.target_vertex}"
            f" now {new.source_vertex} -> {new.target_vertex}"
        )
    return out


def _diff_plain(path: str, old: Any, new: Any) -> list[str]:
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            sub = f"{path}.{k}" if path else k
            if k not in old:
                out.append(f"{sub} added: {_short(new[k])}")
            elif k not in new:
                out.append(f"{sub} removed (was {_short(old[k])})")
            else:
                out.extend(_diff_plain(sub, old[k], new[k]))
        return out
    if isinstance(old, list) and isinstance(new, list):
        id_field = _id_field(old + new)
        if id_field is not None:
            return _diff_identified(path, id_field, old, new)
    return [f"{path or 'value'}: {_short(old)} -> {_short(new)}"]


def _id_field(items: list[Any]) -> str | None:
    for field in _ID_FIELDS:
        if items and all(isinstance(i, dict) and field in i for i in items):
            return field
    return None


def _diff_identified(path: str, field: str, old: list[Any], new: list[Any]) -> list[str]:
    old_by = {i[field]: i for i in old}
    new_by = {i[field]: i for i in new}
    out = [f"{path}['{k}'] added" for k in new_by if k not in old_by]
    out += [f"{path}['{k}'] removed" for k in old_by if k not in new_by]
    for k, item in new_by.items():
        if k in old_by:
            out.extend(_diff_plain(f"{path}['{k}']", old_by[k], item))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
