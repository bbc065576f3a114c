"""A task's snapshot as state segments at the StatePaths of DESIGN.md section 2, and back.

A task snapshot (`records.TaskSnapshot`) splits into:
  keyed state      checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/{shard}/{stateName}
  operator state   checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/operator/state
  split cursors    checkpoint/{ns}/{epoch}/{sourceId}/{subtask}/source/{splitId}
  enumerator       checkpoint/{ns}/{epoch}/{sourceId}/{subtask}/operator/enumerator
  progress         checkpoint/{ns}/{epoch}/{vertexId}/{subtask}/operator/watermarks
  sink txns        checkpoint/{ns}/{epoch}/{sinkId}/{subtask}/sink/{transactionId}
`join` puts the pieces of one task back together from a verified checkpoint; `needed`
names the segments it reads, so a task fetches its own part of a checkpoint, not all of it.
WARNING: `needed` and `join` select by the same rules; change them together (a test
checks that `join` over the needed segments is `join` over all of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nopstream.checkpoint.formats import encode_segment
from nopstream.plan.partitioned import PartitionedPlan, ShardRange
from nopstream.records import PendingTxn, SinkState, TaskSnapshot

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
    state: TaskSnapshot,
    source_id: str | None,
    sink_ids: list[str],
) -> dict[str, bytes]:
    """The segments (path -> bytes) of one task's snapshot at one epoch."""
    out: dict[str, bytes] = {}

    def put(path: str, payload: Any, name: str) -> None:
        out[path] = encode_segment(payload, state_name=name, schema_version=SCHEMA_VERSION)

    for op_id, op_state in state.operators.items():
        for shard, states in op_state.get("keyed", {}).items():
            for name, pairs in states.items():
                put(_path(plan, "keyed", epoch, op_id, subtask, shard=shard, stateName=name), pairs, name)
        rest = {k: v for k, v in op_state.items() if k not in ("keyed", "sink")}
        put(_path(plan, "operator", epoch, op_id, subtask, stateName="state"), rest, "state")
        if op_id in sink_ids:
            sink = SinkState.from_json(op_state.get("sink", {}))
            for txn in sink.pending:
                put(
                    _path(plan, "sink", epoch, op_id, subtask, transactionId=txn.id),
                    txn.to_json(),
                    "transaction",
                )
            put(_path(plan, "operator", epoch, op_id, subtask, stateName="sink"), dict(sink.rest), "sink")
    if source_id is not None and state.source is not None:
        source = state.source
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
    # the task's progress through time: its watermarks, and whether its data has ended
    put(
        _path(plan, "operator", epoch, vertex_id, subtask, stateName="watermarks"),
        state.progress(),
        "watermarks",
    )
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
    shards: ShardRange | None,
    rescaled: bool = False,
) -> TaskSnapshot:
    """One task's snapshot rebuilt from the payloads of a verified checkpoint.

    State is found by what it is, not by which subtask wrote it, so the same join
    serves a rescaled plan: keyed state of every shard this subtask owns (`shards`),
    whichever subtask held it; every split cursor and every finished split of the
    source (readers keep only the splits they own). Operator state is this subtask's;
    in a rescaled plan a subtask that did not exist takes subtask 0's, and watermarks
    start afresh (channel ids change; they advance again from the inputs).
    """
    operators: dict[str, dict[str, Any]] = {}
    for op_id in operator_ids:
        op_state = _operator_state(plan, segments, epoch, op_id, subtask, "state", rescaled=rescaled)
        if op_state is None:
            continue
        keyed: dict[str, dict[str, Any]] = {}
        for (_, shard, name), payload in _under(plan, "keyed", epoch, op_id, segments):
            if shard.isdigit() and (shards is None or int(shard) in shards):
                keyed.setdefault(shard, {})[name] = payload
        if keyed:
            op_state["keyed"] = keyed
        if op_id in sink_ids:
            rest = _operator_state(plan, segments, epoch, op_id, subtask, "sink", rescaled=rescaled) or {}
            sink_prefix = _path(plan, "sink", epoch, op_id, subtask, transactionId="")
            pending = sorted(
                (PendingTxn.from_json(p) for path, p in segments.items() if path.startswith(sink_prefix)),
                key=lambda txn: txn.epoch,
            )
            op_state["sink"] = SinkState(tuple(pending), rest).to_json()
        operators[op_id] = op_state
    source = _joined_source(plan, segments, epoch, source_id) if source_id is not None else None
    state = TaskSnapshot(operators, source)
    if rescaled:
        return state
    progress = segments.get(_path(plan, "operator", epoch, vertex_id, subtask, stateName="watermarks"), {})
    return state.with_progress(progress)


def _joined_source(
    plan: PartitionedPlan, segments: dict[str, Any], epoch: int, source_id: str
) -> dict[str, Any] | None:
    """A source's state from every subtask's enumerator and every split cursor (None: it has none)."""
    enumerators = [
        payload
        for (_, kind, name), payload in _under(plan, "operator", epoch, source_id, segments)
        if (kind, name) == ("operator", "enumerator")
    ]
    if not enumerators:
        return None
    source: dict[str, Any] = {}
    for enumerator in enumerators:
        for key, value in enumerator.items():
            if isinstance(value, list):
                source[key] = sorted({*source.get(key, []), *value})
            elif isinstance(value, dict):  # per split (file heads, object ETags): each split once
                source[key] = {**source.get(key, {}), **value}
            else:
                source[key] = value
    source["cursors"] = {
        p["split"]: p["cursor"]
        for (_, kind, _), p in _under(plan, "source", epoch, source_id, segments)
        if kind == "source"
    }
    return source


def needed(
    plan: PartitionedPlan,
    *,
    vertex_id: str,
    subtask: int,
    epoch: int,
    operator_ids: list[str],
    source_id: str | None,
    sink_ids: list[str],
    shards: ShardRange | None,
    rescaled: bool = False,
) -> Callable[[str], bool]:
    """Whether a segment of `epoch` is one `join` reads for this task (same arguments, no segments)."""
    prefix = (
        plan.state_paths["keyed"]
        .split("{operatorId}")[0]
        .format(ns=plan.identity.checkpoint_namespace, epoch=epoch)
    )
    operators, sinks = set(operator_ids), set(sink_ids)

    def wanted(path: str) -> bool:
        parts = path[len(prefix) :].split("/") if path.startswith(prefix) else []
        if len(parts) != 4 or not parts[1].isdigit():
            return False
        op_id, index, part, name = parts[0], int(parts[1]), parts[2], parts[3]
        if op_id == source_id and (part == "source" or (part, name) == ("operator", "enumerator")):
            return True  # every split of the source, whichever subtask read it
        if op_id == vertex_id and (part, name) == ("operator", "watermarks"):
            return not rescaled and index == subtask
        if op_id not in operators:
            return False
        if part.isdigit():  # keyed state: the shards this subtask owns, whoever held them
            return shards is None or int(part) in shards
        own = index == subtask or (rescaled and index == 0)
        if part == "operator":
            return own and (name == "state" or (name == "sink" and op_id in sinks))
        return part == "sink" and op_id in sinks and index == subtask

    return wanted


def _operator_state(
    plan: PartitionedPlan,
    segments: dict[str, Any],
    epoch: int,
    op_id: str,
    subtask: int,
    name: str,
    *,
    rescaled: bool,
) -> dict[str, Any] | None:
    """An operator's non-keyed state of this subtask (of subtask 0 for a new subtask of a rescaled plan)."""
    for index in (subtask, 0) if rescaled else (subtask,):
        found = segments.get(_path(plan, "operator", epoch, op_id, index, stateName=name))
        if found is not None:
            return dict(found)
    return None


def _under(
    plan: PartitionedPlan, kind: str, epoch: int, operator_id: str, segments: dict[str, Any]
) -> list[tuple[tuple[str, str, str], Any]]:
    """(subtask, part, name) and payload of every segment of an operator at a StatePath kind, any subtask."""
    template = plan.state_paths[kind]
    prefix = template.split("{subtask}")[0].format(
        ns=plan.identity.checkpoint_namespace, epoch=epoch, operatorId=operator_id
    )
    found = []
    for path, payload in segments.items():
        if path.startswith(prefix):
            parts = path[len(prefix) :].split("/")
            if len(parts) == 3 and parts[0].isdigit():
                found.append(((parts[0], parts[1], parts[2]), payload))
    return sorted(found, key=lambda item: (int(item[0][0]), item[0][1], item[0][2]))


def _safe(split_id: str) -> str:
    """A split id as one path segment (file paths contain '/')."""
    return split_id.replace("%", "%25").replace("/", "%2F")
