"""One pass over one StreamJob: observe, validate, reconcile (the Flink operator's loop).

`observe` reads the StreamJob, its pods and etcd and changes nothing. `validate` is
the compiler's validation, the same function as `nopstream validate`. `reconcile`
acts, and its status is a write-ahead log: the target run and plan are recorded in
status before any pod is touched, so a pass interrupted anywhere is finished by the
next. A pass over a job whose world is as it should be writes nothing.

Runs: status `run` is the run the pods belong to; `deployedRun` says every pod of that
run was created. A task pod that failed, is being deleted, or (once deployed) is
missing is a global recovery: `run` advances by compare-and-swap in etcd, the new
run is recorded in status, then the old run's pods are deleted and the new run's are
created. A coordinator pod's loss is not a recovery: it is recreated, and the
standby leads meanwhile.
"""

from __future__ import annotations

import datetime
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nopstream.cluster.layout import Layout
from nopstream.model.errors import ModelError
from nopstream.model.load import load_data
from nopstream.node import guard
from nopstream.plan import compat, compiler
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan
from nopstream_operator.kube import EtcdView, Kube, NameTaken
from nopstream_operator.resources import (
    ANNOTATION_FINGERPRINT,
    JOB_SECRET_KEY,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_TASK,
    PodSettings,
    coordinator_pod,
    job_secret,
    job_secret_name,
    network_policy,
    network_policy_name,
    plan_configmap,
    plan_configmap_name,
    task_pod,
    task_pod_name,
)

Emit = Callable[[dict[str, Any], str, str, str], None]
"""Post a Kubernetes Event about a StreamJob: (job, type, reason, message)."""


@dataclass(frozen=True)
class PodView:
    """What a pass needs to know of a pod."""

    name: str
    role: str
    run: int | None
    task: str | None
    phase: str
    ready: bool
    deleting: bool
    fingerprint: str | None = None


def pod_view(pod: dict[str, Any]) -> PodView:
    """A pod's role, run, task, phase and readiness."""
    meta, status = pod["metadata"], pod.get("status") or {}
    labels = meta.get("labels") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    run = labels.get(LABEL_RUN)
    return PodView(
        name=meta["name"],
        role=labels.get(LABEL_ROLE, ""),
        run=int(run) if run else None,
        task=labels.get(LABEL_TASK),
        phase=status.get("phase", "Pending"),
        ready=conditions.get("Ready") == "True",
        deleting=bool(meta.get("deletionTimestamp")),
        fingerprint=(meta.get("annotations") or {}).get(ANNOTATION_FINGERPRINT),
    )


@dataclass(frozen=True)
class Observed:
    """One StreamJob and its world, as one pass saw them."""

    job: dict[str, Any]
    pods: dict[str, PodView]

    @property
    def status(self) -> dict[str, Any]:
        """The job's status (empty before the first pass)."""
        return dict(self.job.get("status") or {})


@dataclass
class Context:
    """What the passes over one job share: clients, pod settings, events, plans read so far."""

    kube: Kube
    etcd: EtcdView
    pods: PodSettings
    emit: Emit
    plans: dict[str, tuple[PartitionedPlan, DeploymentPlan]] = field(default_factory=dict)


def observe(ctx: Context, namespace: str, name: str) -> Observed | None:
    """Read the job and its pods (None when the job is gone or being deleted); change nothing."""
    job = ctx.kube.job(namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return None
    job_id = (job.get("spec") or {}).get("jobId") or name
    pods = {p.name: p for p in map(pod_view, ctx.kube.pods(namespace, job_id))}
    return Observed(job, pods)


def validate(job: dict[str, Any]) -> compiler.CompiledPlans:
    """Compile the StreamJob for Kubernetes; ModelError lists every issue (as `nopstream validate`)."""
    namespace = job["metadata"]["namespace"]
    loaded = load_data(job, origin=f"streamjob/{job['metadata']['name']}")
    return compiler.compile_model(loaded, backend="kubernetes", namespace=namespace)


def reconcile_once(ctx: Context, namespace: str, name: str) -> None:
    """One whole pass over one StreamJob."""
    seen = observe(ctx, namespace, name)
    if seen is None:
        return
    try:
        desired = validate(seen.job)
    except ModelError as err:
        _invalid(ctx, seen, [str(i) for i in err.issues])
        return
    if seen.status.get("planFingerprint") is None:
        _first_deploy(ctx, seen, desired)
        return
    partitioned, deployment = _deployed_plans(ctx, seen)
    if (seen.job.get("spec") or {}).get("suspend"):
        _suspend(ctx, seen, deployment)
        return
    if seen.status.get("phase") == "Suspended":
        _resume(ctx, seen, deployment)
        return
    if _restart_nonce(ctx, seen, deployment):
        return  # restarted: the next pass starts the new run's pods
    changed = desired.deployment.partitioned_fingerprint != deployment.partitioned_fingerprint
    if changed and _spec_change(ctx, seen, partitioned, deployment, desired):
        return  # redeployed: the next pass starts the new plan's pods
    _savepoint_nonce(ctx, seen, deployment)
    try:
        _reconcile_pods(ctx, seen, deployment)
    except NameTaken as taken:  # nothing of the other owner's is touched; this job waits for the name
        message = f"{taken}: remove it or rename this job"
        ready = next((c for c in _conditions(seen) if c.get("type") == "Ready"), {})
        if ready.get("reason") != "NameConflict":
            ctx.emit(seen.job, "Warning", "NameConflict", message)
        conditions = with_condition(_conditions(seen), "Ready", "False", "NameConflict", message)
        _patch(ctx, seen, {"phase": "Pending", "conditions": conditions})


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_condition(
    conditions: list[dict[str, Any]], kind: str, status: str, reason: str, message: str
) -> list[dict[str, Any]]:
    """The conditions with one set; its transition time moves only when its status does."""
    out = [c for c in conditions if c.get("type") != kind]
    before = next((c for c in conditions if c.get("type") == kind), None)
    moved = before is None or before.get("status") != status
    since = _now() if moved or before is None else before.get("lastTransitionTime", _now())
    out.append(
        {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}
    )
    return sorted(out, key=lambda c: c["type"])


def _patch(ctx: Context, seen: Observed, changes: dict[str, Any]) -> None:
    """Patch only what differs from the observed status (a settled pass writes nothing)."""
    status = seen.status
    diff = {k: v for k, v in changes.items() if status.get(k) != v}
    conditions = changes.get("conditions")
    if conditions is not None and [_timeless(c) for c in conditions] == [
        _timeless(c) for c in status.get("conditions", [])
    ]:
        diff.pop("conditions", None)
    if diff:
        meta = seen.job["metadata"]
        ctx.kube.patch_status(meta["namespace"], meta["name"], diff)
        seen.job["status"] = {**status, **diff}


def _timeless(condition: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in condition.items() if k != "lastTransitionTime"}


def _conditions(seen: Observed) -> list[dict[str, Any]]:
    return list(seen.status.get("conditions") or [])


def _invalid(ctx: Context, seen: Observed, messages: list[str]) -> None:
    text = "; ".join(messages)
    if seen.status.get("phase") != "Invalid":
        ctx.emit(seen.job, "Warning", "Invalid", text)
    conditions = with_condition(_conditions(seen), "Valid", "False", "ValidationFailed", text)
    _patch(ctx, seen, {"phase": "Invalid", "conditions": conditions})


def _first_deploy(ctx: Context, seen: Observed, desired: compiler.CompiledPlans) -> None:
    """Store the plan, take the next run in etcd, and record both (the pods come next pass)."""
    deployment = desired.deployment
    name = plan_configmap_name(deployment.job_id, deployment.partitioned_fingerprint)
    if not ctx.kube.exists("ConfigMap", deployment.namespace, name):
        ctx.kube.create(plan_configmap(seen.job, desired.partitioned, deployment))
    layout = _layout(deployment)
    run = ctx.etcd.advance_run(layout, ctx.etcd.run(layout))
    nonce = (seen.job.get("spec") or {}).get("restartNonce")
    if nonce:  # a new lineage unless storage's lineage was started by this nonce already
        ctx.etcd.request_restart(layout, run, nonce)
    conditions = with_condition(
        _conditions(seen), "Valid", "True", "Compiled", deployment.partitioned_fingerprint
    )
    _patch(
        ctx,
        seen,
        {
            "phase": "Pending",
            "run": run,
            "recoveries": 0,
            "planFingerprint": deployment.partitioned_fingerprint,
            "semanticMode": desired.partitioned.identity.semantic_mode.value,
            "restartNonce": nonce,
            "tasksTotal": len(deployment.tasks),
            "tasksReady": 0,
            "lastStableSpec": seen.job.get("spec"),
            "observedGeneration": seen.job["metadata"].get("generation"),
            "conditions": conditions,
        },
    )
    ctx.emit(seen.job, "Normal", "Deploying", f"plan {deployment.partitioned_fingerprint[:19]}, run {run}")


def _layout(deployment: DeploymentPlan) -> Layout:
    return Layout(deployment.namespace, deployment.job_id, deployment.pipeline_id)


def _deployed_plans(ctx: Context, seen: Observed) -> tuple[PartitionedPlan, DeploymentPlan]:
    """The plans the running pods use, from their ConfigMap (read once per fingerprint)."""
    fp = seen.status["planFingerprint"]
    if fp not in ctx.plans:
        meta = seen.job["metadata"]
        job_id = (seen.job.get("spec") or {}).get("jobId") or meta["name"]
        data = ctx.kube.configmap_data(meta["namespace"], plan_configmap_name(job_id, fp))
        if data is None:
            raise RuntimeError(f"the plan ConfigMap of {fp} is missing")
        partitioned = compiler.load_document(data["partitioned.json"])
        deployment = compiler.load_document(data["deployment.json"])
        assert isinstance(partitioned, PartitionedPlan) and isinstance(deployment, DeploymentPlan)
        ctx.plans[fp] = (partitioned, deployment)
    return ctx.plans[fp]


def _spec_change(
    ctx: Context,
    seen: Observed,
    deployed: PartitionedPlan,
    deployment: DeploymentPlan,
    desired: compiler.CompiledPlans,
) -> bool:
    """Classify a spec change against the deployed plan and carry it out; True once redeployed.

    REFUSED leaves the running job untouched. RESCALE and UPGRADE stop the job with a
    savepoint and redeploy from it (`_upgrade`).
    """
    drop_state = (seen.job.get("spec") or {}).get("dropState") or ()
    verdict = compat.check_compatibility(deployed, desired.partitioned, drop_state=drop_state)
    fp = desired.deployment.partitioned_fingerprint
    reasons = "; ".join(str(r) for r in verdict.reasons)
    if verdict.change is compat.ChangeKind.REFUSED:
        message = f"the change to plan {fp[:19]} is refused: {reasons}"
        conditions = with_condition(_conditions(seen), "SpecChange", "False", "Refused", message)
        if seen.status.get("rejectedFingerprint") != fp:
            ctx.emit(seen.job, "Warning", "SpecChangeRefused", message)
        _patch(ctx, seen, {"conditions": conditions, "rejectedFingerprint": fp})
        return False
    return _upgrade(ctx, seen, deployment, desired, f"{verdict.change.name}: {reasons}")


def _upgrade(
    ctx: Context, seen: Observed, deployment: DeploymentPlan, desired: compiler.CompiledPlans, why: str
) -> bool:
    """Stop with a savepoint, then redeploy the new plan from it; each step recorded in status first."""
    layout = _layout(deployment)
    fp = desired.deployment.partitioned_fingerprint
    run = int(seen.status["run"])
    conditions = with_condition(_conditions(seen), "SpecChange", "True", "StoppingWithSavepoint", why)
    stop = _stop_with_savepoint(
        ctx,
        seen,
        layout,
        f"upgrade to {fp}",
        {"phase": "Upgrading", "conditions": conditions},
        ("Upgrade", f"to plan {fp[:19]} ({why}): stopping with a savepoint"),
    )
    if stop is None:
        return False
    ns = desired.deployment.namespace
    if not ctx.kube.exists("ConfigMap", ns, plan_configmap_name(desired.deployment.job_id, fp)):
        ctx.kube.create(plan_configmap(seen.job, desired.partitioned, desired.deployment))
    ctx.etcd.set_restore(layout, run + 1, stop, deployment.partitioned_fingerprint)
    new_run = ctx.etcd.advance_run(layout, run)
    conditions = with_condition(
        _conditions(seen), "SpecChange", "True", "Redeployed", f"from savepoint {stop}"
    )
    _patch(
        ctx,
        seen,
        {
            "phase": "Upgrading",
            "run": new_run,
            "planFingerprint": fp,
            "stopping": None,
            "tasksTotal": len(desired.deployment.tasks),
            "tasksReady": 0,
            "lastStableSpec": seen.job.get("spec"),
            "observedGeneration": seen.job["metadata"].get("generation"),
            "conditions": conditions,
        },
    )
    ctx.emit(
        seen.job,
        "Normal",
        "Savepoint",
        f"stop savepoint {stop} of plan {deployment.partitioned_fingerprint[:19]}",
    )
    ctx.emit(seen.job, "Normal", "Upgraded", f"run {new_run} starts plan {fp[:19]} from savepoint {stop}")
    for pod in seen.pods.values():
        if not pod.deleting:
            ctx.kube.delete_pod(ns, pod.name, grace=0)
    return True


def _stop_with_savepoint(
    ctx: Context,
    seen: Observed,
    layout: Layout,
    purpose: str,
    first: dict[str, Any],
    event: tuple[str, str],
) -> int | None:
    """Stop the job with a savepoint for `purpose`; its epoch once committed, else None.

    The purpose and the last epoch before it are recorded in status `stopping` first
    (with `first`, and the event posted once); the leading coordinator is asked, and
    asked again when a recovery changed the run since.
    """
    run = int(seen.status["run"])
    stopping = dict(seen.status.get("stopping") or {})
    if stopping.get("for") != purpose:
        stopping = {"for": purpose, "after": ctx.etcd.last_epoch(layout), "requestedInRun": None}
        _patch(ctx, seen, {**first, "stopping": stopping})
        ctx.emit(seen.job, "Normal", *event)
    stop = ctx.etcd.stopped_at(layout, after=int(stopping["after"]))
    if (
        stop is None
        and stopping.get("requestedInRun") != run
        and _request_savepoint(ctx, seen, layout, stop=True)
    ):
        _patch(ctx, seen, {"stopping": {**stopping, "requestedInRun": run}})
    return stop


def _ensure_fences(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """The job's Secret and NetworkPolicy exist (created, owned by the StreamJob, when missing)."""
    ns, name = deployment.namespace, job_secret_name(deployment.job_id)
    if ctx.kube.owned_secret(ns, name, JOB_SECRET_KEY, seen.job["metadata"]["uid"]) is None:
        ctx.kube.create(job_secret(seen.job, deployment, guard.new_secret()))
    policy = network_policy_name(deployment.job_id)
    if ctx.pods.network_policy and not ctx.kube.exists("NetworkPolicy", ns, policy):
        ctx.kube.create(network_policy(seen.job, deployment, ctx.pods))


def _request_savepoint(ctx: Context, seen: Observed, layout: Layout, *, stop: bool) -> bool:
    """Ask the leading coordinator for a savepoint (`stop`: and stop at it); whether it took the request."""
    endpoint = ctx.etcd.leader_endpoint(layout)
    uid = seen.job["metadata"]["uid"]
    secret = ctx.kube.owned_secret(layout.namespace, job_secret_name(layout.job_id), JOB_SECRET_KEY, uid)
    if endpoint is None or secret is None:
        return False
    query = "?stop=true" if stop else ""
    request = urllib.request.Request(
        f"{endpoint}/savepoint{query}", method="POST", headers=guard.headers(secret)
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _suspend(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """spec.suspend: stop with a savepoint, then remove every pod; phase Suspended."""
    if seen.status.get("phase") != "Suspended":
        stop = _stop_with_savepoint(
            ctx,
            seen,
            _layout(deployment),
            "suspend",
            {},
            ("Suspend", "stopping with a savepoint, then removing the pods"),
        )
        if stop is None:
            _reconcile_pods(ctx, seen, deployment)  # recoveries go on until the savepoint
            return
        conditions = with_condition(_conditions(seen), "Ready", "False", "Suspended", f"at savepoint {stop}")
        _patch(
            ctx, seen, {"phase": "Suspended", "suspendedAt": stop, "stopping": None, "conditions": conditions}
        )
        ctx.emit(seen.job, "Normal", "Suspended", f"at savepoint {stop}; the pods are removed")
    for pod in seen.pods.values():
        if not pod.deleting:
            ctx.kube.delete_pod(deployment.namespace, pod.name, grace=0)


def _resume(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """spec.suspend back to false: a new run, which restores the savepoint it stopped at."""
    new_run = ctx.etcd.advance_run(_layout(deployment), int(seen.status["run"]))
    _patch(ctx, seen, {"phase": "Pending", "run": new_run, "suspendedAt": None, "tasksReady": 0})
    ctx.emit(
        seen.job, "Normal", "Resumed", f"run {new_run} restores savepoint {seen.status.get('suspendedAt')}"
    )


def _restart_nonce(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> bool:
    """A new spec.restartNonce starts the job over: a new run in a new lineage that restores nothing.

    Recorded in status first; the new run's restore point in etcd asks its coordinator
    for the new lineage (started once per nonce, so a repeated pass changes nothing);
    then every pod goes, coordinators too (a finished job's have completed).
    """
    nonce = (seen.job.get("spec") or {}).get("restartNonce")
    if not nonce or nonce == seen.status.get("restartNonce"):
        return False
    layout = _layout(deployment)
    run = int(seen.status["run"])
    ctx.etcd.request_restart(layout, run + 1, nonce)
    new_run = ctx.etcd.advance_run(layout, run)
    conditions = with_condition(_conditions(seen), "Ready", "False", "Restarting", f"restart nonce {nonce}")
    _patch(
        ctx,
        seen,
        {
            "phase": "Pending",
            "run": new_run,
            "restartNonce": nonce,
            "recoveries": 0,
            "tasksReady": 0,
            "stopping": None,
            "conditions": conditions,
        },
    )
    ctx.emit(seen.job, "Normal", "Restarted", f"run {new_run} starts a new lineage (restart nonce {nonce})")
    for pod in seen.pods.values():
        if not pod.deleting:
            ctx.kube.delete_pod(deployment.namespace, pod.name, grace=0)
    return True


def _savepoint_nonce(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """A new spec.savepointNonce asks for a savepoint; the next committed one carries the nonce."""
    nonce = (seen.job.get("spec") or {}).get("savepointNonce")
    if not nonce or nonce == seen.status.get("savepointNonce"):
        return
    layout = _layout(deployment)
    after = ctx.etcd.last_epoch(layout)
    if _request_savepoint(ctx, seen, layout, stop=False):
        _patch(ctx, seen, {"savepointNonce": nonce, "savepointRequest": {"nonce": nonce, "after": after}})
        ctx.emit(seen.job, "Normal", "SavepointRequested", f"nonce {nonce}")


def _savepoints(ctx: Context, seen: Observed, epochs: list[int]) -> dict[str, Any]:
    """Status of the committed savepoints, with the nonces that asked for them; a matched request is done."""
    known = {int(s["epoch"]): s.get("nonce") for s in seen.status.get("savepoints") or []}
    request = seen.status.get("savepointRequest")
    out = []
    for epoch in epochs:
        nonce = known.get(epoch)
        if nonce is None and request and epoch > int(request["after"]):
            nonce = request["nonce"]
            request = None
            ctx.emit(seen.job, "Normal", "Savepoint", f"savepoint {epoch} (nonce {nonce})")
        out.append({"epoch": epoch, "nonce": nonce} if nonce else {"epoch": epoch})
    return {"savepoints": out, "savepointRequest": request}


def _reconcile_pods(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """Coordinators present, old runs gone, the current run whole (or recovered), status current."""
    if seen.status.get("phase") == "Failed":
        return  # its pods are gone; a spec change or a new StreamJob starts it again
    ns, run = deployment.namespace, int(seen.status["run"])
    if not ctx.kube.exists(
        "ConfigMap", ns, plan_configmap_name(deployment.job_id, deployment.partitioned_fingerprint)
    ):
        raise RuntimeError("the deployed plan's ConfigMap is gone")
    _ensure_fences(ctx, seen, deployment)  # before any pod mounts the secret or listens
    for name in deployment.coordinators:
        pod = seen.pods.get(name)
        if pod is None:
            ctx.kube.create(coordinator_pod(seen.job, deployment, name, ctx.pods))
        elif (
            pod.phase == "Failed" or pod.fingerprint != deployment.partitioned_fingerprint
        ) and not pod.deleting:
            ctx.kube.delete_pod(ns, name, grace=0)
    tasks = [p for p in seen.pods.values() if p.role == "task"]
    for pod in tasks:
        if pod.run != run and not pod.deleting:
            ctx.kube.delete_pod(ns, pod.name, grace=0)
    current = {p.task: p for p in tasks if p.run == run}
    if seen.status.get("phase") == "Succeeded":
        return
    lost = [p.name for p in current.values() if p.phase == "Failed" or p.deleting]
    if seen.status.get("deployedRun") == run:
        lost += [task_pod_name(t, run) + " (gone)" for t in deployment.tasks if t.name not in current]
    if lost:
        _recover(ctx, seen, deployment, run, lost, current)
        return
    for t in deployment.tasks:
        if t.name not in current:
            ctx.kube.create(task_pod(seen.job, deployment, t, run, ctx.pods))
    changes: dict[str, Any] = {"deployedRun": run}
    _refresh(ctx, seen, deployment, current, changes)


def _recover(
    ctx: Context,
    seen: Observed,
    deployment: DeploymentPlan,
    run: int,
    lost: list[str],
    current: dict[str | None, PodView],
) -> None:
    """A global recovery: the next run recorded first, then the old run's pods deleted.

    Past spec.maxRecoveries the job is Failed instead: its task pods go, its
    checkpoints stay (a spec change or a new StreamJob can start from them).
    """
    recoveries = int(seen.status.get("recoveries") or 0) + 1
    limit = int((seen.job.get("spec") or {}).get("maxRecoveries", 10))
    if recoveries > limit:
        message = f"{', '.join(sorted(lost))} failed after {limit} recoveries: the job has failed"
        conditions = with_condition(_conditions(seen), "Ready", "False", "TooManyRecoveries", message)
        _patch(ctx, seen, {"phase": "Failed", "tasksReady": 0, "conditions": conditions})
        ctx.emit(seen.job, "Warning", "Failed", message)
        for pod in seen.pods.values():
            if not pod.deleting:
                ctx.kube.delete_pod(deployment.namespace, pod.name, grace=0)
        return
    nonce = seen.status.get("restartNonce")
    if nonce:  # a lineage the failed run may not have started yet (once per nonce: harmless after)
        ctx.etcd.request_restart(_layout(deployment), run + 1, nonce)
    new_run = ctx.etcd.advance_run(_layout(deployment), run)
    message = f"{', '.join(sorted(lost))} failed: run {run} -> {new_run}, restoring the latest durable epoch"
    conditions = with_condition(_conditions(seen), "Ready", "False", "Recovering", message)
    _patch(
        ctx,
        seen,
        {
            "run": new_run,
            "phase": "Recovering",
            "recoveries": recoveries,
            "tasksReady": 0,
            "conditions": conditions,
        },
    )
    ctx.emit(seen.job, "Warning", "Recovery", message)
    for pod in current.values():
        if not pod.deleting:
            ctx.kube.delete_pod(deployment.namespace, pod.name, grace=0)


def _refresh(
    ctx: Context,
    seen: Observed,
    deployment: DeploymentPlan,
    current: dict[str | None, PodView],
    changes: dict[str, Any],
) -> None:
    """Phase, readiness and epochs from what was observed."""
    total = len(deployment.tasks)
    ready = sum(1 for p in current.values() if p.ready and p.phase == "Running")
    succeeded = len(current) == total and all(p.phase == "Succeeded" for p in current.values())
    phase = seen.status.get("phase")
    conditions = _conditions(seen)
    if succeeded:
        phase = "Succeeded"
        conditions = with_condition(conditions, "Ready", "False", "Succeeded", "the final epoch is committed")
    elif ready == total and not seen.status.get("stopping"):  # stopping: still Upgrading
        phase = "Running"
        conditions = with_condition(
            conditions, "Ready", "True", "AllTasksReady", f"{ready}/{total} tasks ready"
        )
    durable, committed, savepoints = ctx.etcd.epochs(_layout(deployment))
    changes.update(
        {
            "phase": phase,
            "tasksReady": ready,
            "tasksTotal": total,
            "latestDurableEpoch": durable,
            "latestCommittedEpoch": committed,
            **_savepoints(ctx, seen, savepoints),
            "conditions": conditions,
        }
    )
    if phase != seen.status.get("phase") and phase in ("Running", "Succeeded"):
        ctx.emit(seen.job, "Normal", phase, f"run {seen.status['run']}: {ready}/{total} tasks ready")
    _patch(ctx, seen, changes)


def cleanup(kube: Kube, namespace: str, job_id: str) -> None:
    """The job is deleted: remove its pods, plan ConfigMaps, Secret and NetworkPolicy (checkpoints stay)."""
    for pod in map(pod_view, kube.pods(namespace, job_id)):
        if not pod.deleting:
            kube.delete_pod(namespace, pod.name, grace=0)
    kube.delete_configmaps(namespace, job_id)
    kube.delete("Secret", namespace, job_secret_name(job_id))
    kube.delete("NetworkPolicy", namespace, network_policy_name(job_id))
