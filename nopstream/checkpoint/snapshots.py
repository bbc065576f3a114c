"""A task's snapshot as state segments at the StatePaths of DESIGN.md section 2, and back.

A task snapshot (`runtime.task.Task.snapshot`) splits into:
  keyed state      checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/{shard}/{stateName}
  operator state   checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/operator/state
  split cursors    checkpoint/{ns}/{epoch}/{sourceId}/{subtask}/source/{splitId}
  enumerator       checkpoint/{ns}/{epoch}/{sourceId}/{subtask}/operator/enumerator
  watermarks       checkpoint/{ns}/{epoch}/{vertexId}/{subtask}/operator/watermarks
  sink txns        checkpoint/{ns}/{epoch}/{sinkId}/{subtask}/sink/{transactionId}
`join` puts the pieces of one task back together from a verified checkpoint.
"""

from __future__ import annotations

from typing import Any

from nopstream.checkpoint.formats import encode_segment
from nopstream.plan.partitioned import PartitionedPlan

SCHEMA_VERSION = 1


def _path(plan: PartitionedPlan, kind: str, epoch: int, operator_id: str, subtask: int, **names: str) -> str:
    template = plan.state_paths[kind]
    return template.format(
        ns=plan.identity.checkpoint_namespace, epoch=epoch, operatorId=operator_id, subtask=subtask, **names
    )


def split(
    plan: PartitionedPlan,
    *,
    vertex_id: str,
    subtask: int,
    epoch: int,
    state: dict[str, Any],
    source_id: str | None,
    sink_ids: list[str],
) -> dict[str, bytes]:
    """The segments (path -> bytes) of one task's snapshot at one epoch."""
    out: dict[str, bytes] = {}

    def put(path: str, payload: Any, name: str) -> None:
        out[path] = encode_segment(payload, state_name=name, schema_version=SCHEMA_VERSION)

    for op_id, op_state in state.get("operators", {}).items():
        for shard, states in op_state.get("keyed", {}).items():
            for name, pairs in states.items():
                put(_path(plan, "keyed", epoch, op_id, subtask, shard=shard, stateName=name), pairs, name)
        rest = {k: v for k, v in op_state.items() if k not in ("keyed", "sink")}
        put(_path(plan, "operator", epoch, op_id, subtask, stateName="state"), rest, "state")
        if op_id in sink_ids:
            for txn in op_state.get("sink", {}).get("pending", []):
                put(_path(plan, "sink", epoch, op_id, subtask, transactionId=txn["id"]), txn, "transaction")
            sink_rest = {k: v for k, v in op_state.get("sink", {}).items() if k != "pending"}
            put(_path(plan, "operator", epoch, op_id, subtask, stateName="sink"), sink_rest, "sink")
    if source_id is not None and "source" in state:
        source = state["source"]
        for split_id, cursor in source.get("cursors", {}).items():
            put(
                _path(plan, "source", epoch, source_id, subtask, splitId=_safe(split_id)),
                {"split": split_id, "cursor": cursor},
                "split",
            )
        enumerator = {k: v for k, v in source.items() if k != "cursors"}
        put(
            _path(plan, "operator", epoch, source_id, subtask, stateName="enumerator"),
            enumerator,
            "enumerator",
        )
    marks = {k: state[k] for k in ("watermarks", "sourceWatermark") if k in state}
    put(_path(plan, "operator", epoch, vertex_id, subtask, stateName="watermarks"), marks, "watermarks")
    return out


def join(
    plan: PartitionedPlan,
    *,
    vertex_id: str,
    subtask: int,
    epoch: int,
    segments: dict[str, Any],
    operator_ids: list[str],
    source_id: str | None,
    sink_ids: list[str],
) -> dict[str, Any]:
    """One task's snapshot rebuilt from the payloads of a verified checkpoint."""
    state: dict[str, Any] = {"operators": {}}
    for op_id in operator_ids:
        base = _path(plan, "operator", epoch, op_id, subtask, stateName="state")
        if base not in segments:
            continue
        op_state = dict(segments[base])
        keyed: dict[str, dict[str, Any]] = {}
        prefix = base[: -len("operator/state")]
        for path, payload in segments.items():
            rest = path[len(prefix) :] if path.startswith(prefix) else ""
            parts = rest.split("/")
            if len(parts) == 2 and parts[0].isdigit():
                keyed.setdefault(parts[0], {})[parts[1]] = payload
        if keyed:
            op_state["keyed"] = keyed
        if op_id in sink_ids:
            sink = dict(segments.get(_path(plan, "operator", epoch, op_id, subtask, stateName="sink"), {}))
            sink_prefix = _path(plan, "sink", epoch, op_id, subtask, transactionId="")
            sink["pending"] = sorted(
                (p for path, p in segments.items() if path.startswith(sink_prefix)), key=lambda t: t["epoch"]
            )
            op_state["sink"] = sink
        state["operators"][op_id] = op_state
    if source_id is not None:
        enum_path = _path(plan, "operator", epoch, source_id, subtask, stateName="enumerator")
        if enum_path in segments:
            source = dict(segments[enum_path])
            split_prefix = _path(plan, "source", epoch, source_id, subtask, splitId="")
            source["cursors"] = {
                p["split"]: p["cursor"] for path, p in segments.items() if path.startswith(split_prefix)
            }
            state["source"] = source
    marks = segments.get(_path(plan, "operator", epoch, vertex_id, subtask, stateName="watermarks"), {})
    state.update(marks)
    return state


def _safe(split_id: str) -> str:
    """A split id as one path segment (file paths contain '/')."""
    return split_id.replace("%", "%25").replace("/", "%2F")
