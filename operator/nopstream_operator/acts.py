"""What a pass writes: the job's status (only what differs, with its derived conditions), Events,
pod deletions and requests to its coordinator."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nopstream.cluster.layout import Layout
from nopstream.model.status import (
    Condition,
    ConditionStatus,
    StreamJobStatus,
)
from nopstream.node.wire.coordinator_client import CoordinatorClient, CoordinatorError
from nopstream.node.wire.tls import JobCertificate, TlsError
from nopstream.plan.deployment import DeploymentPlan
from nopstream_operator import health
from nopstream_operator.kube import Kube
from nopstream_operator.observed import Context, Observed, PodView
from nopstream_operator.resources import (
    JOB_SECRET_KEY,
    job_secret_name,
)


def _now() -> str:
    return health.rfc3339(health.now_ms())


def with_condition(
    conditions: list[Condition], kind: str, status: ConditionStatus, reason: str, message: str
) -> list[Condition]:
    """The conditions with one set; its transition time moves only when its status does."""
    before = next((c for c in conditions if c.type == kind), None)
    kept = before is not None and before.status == status and before.last_transition_time
    since = before.last_transition_time if kept and before is not None else None
    condition = Condition(
        type=kind, status=status, reason=reason, message=message, last_transition_time=since or _now()
    )
    return sorted([*(c for c in conditions if c.type != kind), condition], key=lambda c: c.type)


def has_condition(conditions: list[Condition], kind: str, reason: str) -> bool:
    """Whether condition `kind` holds with this reason."""
    return any(c.type == kind and c.reason == reason for c in conditions)


def patch(ctx: Context, seen: Observed, **changes: Any) -> None:
    """Patch these StreamJobStatus fields where they differ from the observed status (settled: no write).

    Progressing and Degraded are derived here from the phase and Ready, for every write.
    """
    phase = changes.get("phase", seen.status.phase)
    if phase is not None:
        conditions = changes.get("conditions", seen.status.conditions)
        for kind, status, reason, message in health.health(conditions, phase):
            conditions = with_condition(conditions, kind, status, reason, message)
        changes["conditions"] = conditions
    held = dict(seen.job.get("status") or {})
    diff = {k: v for k, v in StreamJobStatus.patch(**changes).items() if held.get(k) != v}
    if "conditions" in diff and _timeless(diff["conditions"]) == _timeless(held.get("conditions") or []):
        del diff["conditions"]
    if diff:
        meta = seen.job["metadata"]
        ctx.kube.patch_status(meta["namespace"], meta["name"], diff)
        seen.job["status"] = {**held, **diff}


def _timeless(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions as the status holds them, without their transition times."""
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conditions]


def waits(ctx: Context, seen: Observed, reason: str, message: str) -> None:
    """The job waits, Pending and not Ready for `reason`, touching nothing (a Warning event once)."""
    ready = next((c for c in seen.status.conditions if c.type == "Ready"), None)
    if ready is None or ready.reason != reason:
        ctx.emit(seen.job, "Warning", reason, message)
    conditions = with_condition(seen.status.conditions, "Ready", "False", reason, message)
    patch(ctx, seen, phase="Pending", conditions=conditions)


def invalid(ctx: Context, seen: Observed, messages: list[str]) -> None:
    text = "; ".join(messages)
    if seen.status.phase != "Invalid":
        ctx.emit(seen.job, "Warning", "Invalid", text)
    conditions = with_condition(seen.status.conditions, "Valid", "False", "ValidationFailed", text)
    patch(ctx, seen, phase="Invalid", conditions=conditions)


def request_savepoint(ctx: Context, seen: Observed, layout: Layout, *, stop: bool) -> bool:
    """Ask the leading coordinator for a savepoint (`stop`: and stop at it); whether it took the request."""
    endpoint = seen.etcd.leader_endpoint
    uid = seen.job["metadata"]["uid"]
    data = ctx.kube.owned_secret(layout.namespace, job_secret_name(layout.job_id), uid)
    if endpoint is None or data is None or JOB_SECRET_KEY not in data:
        return False
    try:
        context = JobCertificate.from_files(data).client_context()
        CoordinatorClient(endpoint, data[JOB_SECRET_KEY].decode(), timeout=5, tls=context).savepoint(
            stop=stop
        )
    except (CoordinatorError, KeyError, TlsError):
        return False
    return True


def fail(ctx: Context, seen: Observed, deployment: DeploymentPlan, reason: str, message: str) -> None:
    """Phase Failed for `reason`: its pods go, its checkpoints stay (a spec change can start it again)."""
    conditions = with_condition(seen.status.conditions, "Ready", "False", reason, message)
    patch(ctx, seen, phase="Failed", tasks_ready=0, conditions=conditions)
    ctx.emit(seen.job, "Warning", "Failed", message)
    delete_pods(ctx.kube, deployment.namespace, seen.pods.values())


def delete_pods(kube: Kube, namespace: str, pods: Iterable[PodView]) -> None:
    """Delete each of `pods` at once (grace 0: its processes are crash-only) unless it is being deleted
    already on a node that is not lost (that kubelet ends it; a lost node's never would)."""
    for pod in pods:
        if not pod.deleting or pod.node_lost:
            kube.delete_pod(namespace, pod.name, grace=0)
