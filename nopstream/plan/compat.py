"""Compatibility of a running plan with a new one: the verdict on a spec change.

One function classifies a change as IGNORE < RESCALE < UPGRADE < REFUSED (the worst
reason wins) with a reason per finding that names the operator and the rule. Rules
(docs/evolution.md): the lineage (job, pipeline, checkpoint namespace), the state
shard count and the hash policy are fixed; a stateful operator keeps its id, type,
key selector, state schema version and state layout (window kind and time,
aggregate, CEP steps) or its state must be dropped explicitly (`dropState`); a
source or sink keeps its connector type (its offsets and transactions); a
parallelism change is a rescale in which shard owners move and keyed payloads are
not rewritten; anything else that differs is an upgrade.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from nopstream.model.catalogue import SINK_TYPES
from nopstream.plan.canonical import fingerprint
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.plan.streamgraph import StreamNode

_STATE_LAYOUT_FIELDS = ("window.kind", "window.time", "aggregate", "pattern.steps")


class ChangeKind(IntEnum):
    """How a spec change must be carried out; ordered from harmless to refused."""

    IGNORE = 0
    RESCALE = 1
    UPGRADE = 2
    REFUSED = 3


@dataclass(frozen=True)
class Reason:
    """One finding: its kind, the rule, the operator it concerns, and a sentence."""

    kind: ChangeKind
    rule: str
    operator_id: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.kind.name} [{self.rule}] {self.message}"


@dataclass(frozen=True)
class Verdict:
    """The classification of a change and every reason behind it."""

    change: ChangeKind
    reasons: tuple[Reason, ...]


def check_compatibility(
    old: PartitionedPlan, new: PartitionedPlan, *, drop_state: Iterable[str] = ()
) -> Verdict:
    """Classify the change from `old` to `new`; `drop_state` names operators whose state may go."""
    if fingerprint(old) == fingerprint(new):
        return Verdict(ChangeKind.IGNORE, ())
    dropped = frozenset(drop_state)
    reasons = _identity_reasons(old, new)
    old_ops, new_ops = old.operators(), new.operators()
    for op_id, op in old_ops.items():
        if op_id not in new_ops:
            reasons.append(_removed(op, dropped))
    for op_id, op in new_ops.items():
        before = old_ops.get(op_id)
        if before is None:
            reasons.append(Reason(ChangeKind.UPGRADE, "operator-added", op_id, f"{_name(op)} is added"))
        elif before != op:
            reasons.extend(_operator_reasons(before, op, dropped))
    reasons.extend(_split_reasons(old, new))
    if {e.edge_id for e in old.edges} != {e.edge_id for e in new.edges} and not reasons:
        reasons.append(Reason(ChangeKind.UPGRADE, "topology", None, "the vertex edges change"))
    if not reasons:
        reasons.append(Reason(ChangeKind.UPGRADE, "plan-changed", None, "the plan changes"))
    return Verdict(max(r.kind for r in reasons), tuple(reasons))


def _split_reasons(old: PartitionedPlan, new: PartitionedPlan) -> list[Reason]:
    """A source whose splits are fixed at compile time keeps the same splits: each split's cursor is its
    position in its own sequence, which another set of splits numbers differently."""
    before = {s.operator_id: s for s in old.sources if s.assignment is not None}
    reasons = []
    for now in new.sources:
        was = before.get(now.operator_id)
        if was is None or now.assignment is None:
            continue
        old_splits, new_splits = (
            sum(len(a) for a in was.assignment or ()),
            sum(len(a) for a in now.assignment),
        )
        if old_splits != new_splits:
            reasons.append(
                Reason(
                    ChangeKind.REFUSED,
                    "source-splits",
                    now.operator_id,
                    f"source '{now.operator_id}' would read {new_splits} splits instead of {old_splits}:"
                    f" its cursors belong to those {old_splits} (set config.splits to {old_splits} to"
                    " rescale it)",
                )
            )
    return reasons


def _name(op: StreamNode) -> str:
    return f"{op.kind} '{op.node_id}' ({op.type})"


def _identity_reasons(old: PartitionedPlan, new: PartitionedPlan) -> list[Reason]:
    a, b = old.identity, new.identity
    reasons = []
    for field, label, rule in (
        ("job_id", "jobId", "lineage"),
        ("pipeline_id", "pipelineId", "lineage"),
        ("checkpoint_namespace", "checkpointNamespace", "lineage"),
        ("state_shard_count", "stateShardCount", "state-shard-count"),
        ("hash_policy", "hash policy", "hash-policy"),
    ):
        was, now = getattr(a, field), getattr(b, field)
        if was != now:
            reasons.append(
                Reason(
                    ChangeKind.REFUSED,
                    rule,
                    None,
                    f"{label} is fixed for the job's lifetime: {was!r} -> {now!r}",
                )
            )
    if a.semantic_mode != b.semantic_mode:
        reasons.append(
            Reason(
                ChangeKind.UPGRADE,
                "semantic-mode",
                None,
                f"semanticMode {a.semantic_mode.value} -> {b.semantic_mode.value}",
            )
        )
    if a.plan_version != b.plan_version:
        reasons.append(
            Reason(
                ChangeKind.UPGRADE,
                "plan-version",
                None,
                f"planVersion {a.plan_version} -> {b.plan_version}",
            )
        )
    return reasons


def _removed(op: StreamNode, dropped: frozenset[str]) -> Reason:
    if not op.stateful:
        return Reason(ChangeKind.UPGRADE, "operator-removed", op.node_id, f"{_name(op)} is removed")
    if op.node_id in dropped:
        return Reason(
            ChangeKind.UPGRADE,
            "state-dropped",
            op.node_id,
            f"{_name(op)} is removed and its state is dropped (dropState)",
        )
    return Reason(
        ChangeKind.REFUSED,
        "removed-stateful-operator",
        op.node_id,
        f"{_name(op)} is removed but has state; list it in dropState to discard that state",
    )


def _operator_reasons(old: StreamNode, new: StreamNode, dropped: frozenset[str]) -> list[Reason]:
    reasons: list[Reason] = []
    stateful = old.stateful and new.stateful and new.node_id not in dropped
    refusals = _state_refusals(old, new) if stateful else []
    reasons.extend(Reason(ChangeKind.REFUSED, rule, new.node_id, msg) for rule, msg in refusals)
    if old.parallelism != new.parallelism:
        reasons.append(
            Reason(
                ChangeKind.RESCALE,
                "rescale",
                new.node_id,
                f"{_name(new)} parallelism {old.parallelism} -> {new.parallelism}: {_rescale_note(new)}",
            )
        )
    rest_old = {k: v for k, v in old.spec.items() if k != "parallelism"}
    rest_new = {k: v for k, v in new.spec.items() if k != "parallelism"}
    if not refusals and rest_old != rest_new:
        fields = sorted(k for k in set(rest_old) | set(rest_new) if rest_old.get(k) != rest_new.get(k))
        reasons.append(
            Reason(
                ChangeKind.UPGRADE,
                "operator-changed",
                new.node_id,
                f"{_name(new)} changes {', '.join(fields)}",
            )
        )
    return reasons


def _state_refusals(old: StreamNode, new: StreamNode) -> list[tuple[str, str]]:
    name = _name(new)
    if (old.kind, old.type) != (new.kind, new.type):
        if new.kind == "sink":
            return [
                (
                    "sink-protocol",
                    f"{name} was a {old.type} sink ({_sink_protocol(old)});"
                    f" its pending transactions cannot move to a {new.type} sink ({_sink_protocol(new)})",
                )
            ]
        return [
            (
                "operator-type",
                f"{name} was of type {old.type}; its state cannot be restored"
                " into another type (or drop it with dropState)",
            )
        ]
    found = []
    if old.key != new.key:
        was = old.key.describe() if old.key else "none"
        now = new.key.describe() if new.key else "none"
        found.append(
            (
                "key-selector",
                f"{name} key selector {was} -> {now}: keyed state would be found under the wrong keys",
            )
        )
    if old.spec.get("stateVersion") != new.spec.get("stateVersion"):
        found.append(
            (
                "state-schema",
                f"{name} stateVersion {old.spec.get('stateVersion')} ->"
                f" {new.spec.get('stateVersion')}: no migration is declared",
            )
        )
    for field in _STATE_LAYOUT_FIELDS:
        was, now = _get(old.spec, field), _get(new.spec, field)
        if was != now:
            found.append(
                (
                    "state-layout",
                    f"{name} {field} {was!r} -> {now!r} changes the layout of its state",
                )
            )
    return found


def _sink_protocol(op: StreamNode) -> str:
    sink = SINK_TYPES.get(op.type)
    return sink.capability.value if sink else "unknown protocol"


def _rescale_note(op: StreamNode) -> str:
    if op.key is not None:
        return "shard owners move; keyed payloads are not rewritten"
    if op.kind == "source":
        return "splits are reassigned from the restored enumerator state"
    if op.kind == "sink":
        return "the savepoint commits every pending transaction; new subtasks open new ones"
    return "stateless"


def _get(spec: dict[str, Any], dotted: str) -> Any:
    value: Any = spec
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
