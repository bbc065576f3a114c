"""The observed state of a StreamJob (its `status`), as the operator writes it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from nopstream.model.spec import Spec

Phase = Literal[
    "Pending", "Running", "Recovering", "Upgrading", "Suspended", "Succeeded", "Failed", "Invalid"
]


class Condition(Spec):
    """A Kubernetes-style condition with its reason."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None


class Savepoint(Spec):
    """A durable epoch kept on request; retention never deletes it."""

    epoch: int
    nonce: str | None = None
    created_at: str | None = None


class StreamJobStatus(Spec):
    """What the operator observed and decided; a write-ahead log of runs and plans."""

    phase: Phase | None = None
    run: int | None = None
    target_run: int | None = None
    recoveries: int | None = None
    plan_fingerprint: str | None = None
    semantic_mode: str | None = None
    latest_durable_epoch: int | None = None
    latest_committed_epoch: int | None = None
    savepoints: list[Savepoint] = Field(default_factory=list)
    tasks_ready: int | None = None
    tasks_total: int | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    last_stable_spec: dict[str, Any] | None = None
    deployed_run: int | None = None
    rejected_fingerprint: str | None = None
    stopping: dict[str, Any] | None = None
    suspended_at: int | None = None
    savepoint_nonce: str | None = None
    restart_nonce: str | None = None
    savepoint_request: dict[str, Any] | None = None
