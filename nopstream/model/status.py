"""The observed state of a StreamJob (its `status`): the operator's one codec for it.

The operator reads a StreamJob's status only through `StreamJobStatus.read` and writes
it only through `StreamJobStatus.patch`; the CRD's status schema is generated from the
same model (`model.crd`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from nopstream.model.spec import Spec

Phase = Literal[
    "Pending", "Running", "Recovering", "Upgrading", "Suspended", "Succeeded", "Failed", "Invalid"
]
ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(Spec):
    """A Kubernetes-style condition with its reason."""

    type: str
    status: ConditionStatus
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None


class Savepoint(Spec):
    """A durable epoch kept on request; retention never deletes it."""

    epoch: int
    nonce: str | None = None
    created_at: str | None = None


class Stopping(Spec):
    """A stop with a savepoint under way: what for, the last epoch before it, the run it was asked of."""

    purpose: str = Field(alias="for")  # the key older operators wrote
    after: int
    requested_in_run: int | None = None


class SavepointRequest(Spec):
    """A savepoint `spec.savepointNonce` asked for: the first committed after `after` carries the nonce."""

    nonce: str
    after: int


class Leader(Spec):
    """The leading coordinator: its pod, and the fencing token its writes carry."""

    pod: str
    token: int


class StreamJobStatus(Spec):
    """What the operator observed and decided; a write-ahead log of runs and plans."""

    phase: Phase | None = None
    run: int | None = None
    recoveries: int | None = None
    failed_at: list[int] = Field(default_factory=list)
    """When the failures within the restart policy's window happened (ms since the epoch), the last last."""
    plan_fingerprint: str | None = None
    semantic_mode: str | None = None
    latest_durable_epoch: int | None = None
    latest_durable_at: str | None = None
    latest_committed_epoch: int | None = None
    latest_committed_at: str | None = None
    pending_commits: list[int] = Field(default_factory=list)
    """Durable epochs whose sink transactions are not all committed yet."""
    leader: Leader | None = None
    savepoints: list[Savepoint] = Field(default_factory=list)
    tasks_ready: int | None = None
    tasks_total: int | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    deployed_run: int | None = None
    rejected_fingerprint: str | None = None
    stopping: Stopping | None = None
    suspended_at: int | None = None
    savepoint_nonce: str | None = None
    restart_nonce: str | None = None
    savepoint_request: SavepointRequest | None = None

    @classmethod
    def read(cls, held: Mapping[str, Any] | None) -> StreamJobStatus:
        """The status a StreamJob holds; keys this version does not know (an older one's) are ignored."""
        known = {field.alias or name for name, field in cls.model_fields.items()}
        return cls.model_validate({k: v for k, v in (held or {}).items() if k in known})

    @classmethod
    def patch(cls, **changes: Any) -> dict[str, Any]:
        """A merge patch setting these fields (by name; None removes one), as the status holds them."""
        dumped = cls.model_validate(changes).model_dump(by_alias=True, mode="json")
        keys = {name: cls.model_fields[name].alias or name for name in changes}
        return {key: _without_nulls(dumped[key]) for key in keys.values()}


def _without_nulls(value: Any) -> Any:
    """A value with the unset (None) fields of its nested objects left out, as the API stores them."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
