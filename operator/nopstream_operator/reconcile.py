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

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nopstream.checkpoint.restore import NewLineage, RestoreRequest
from nopstream.cluster.layout import Layout
from nopstream.errors import REFUSED_EXITS, TASK_LINE, Refusal
from nopstream.model.errors import Issue, ModelError
from nopstream.model.load import LoadedModel, load_data
from nopstream.model.spec import SinkSpec, SourceSpec, StreamModel
from nopstream.model.status import (
    Condition,
    ConditionStatus,
    Leader,
    Savepoint,
    SavepointRequest,
    Stopping,
    StreamJobStatus,
)
from nopstream.node import guard, recovery
from nopstream.node.coordinator_client import CoordinatorClient, CoordinatorError
from nopstream.plan import compat, compiler
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan
from nopstream_operator import health
from nopstream_operator.kube import EtcdView, JobInEtcd, Kube, NameTaken
from nopstream_operator.resources import (
    ANNOTATION_FINGERPRINT,
    JOB_SECRET_KEY,
    LABEL_LEADER,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_STANDBY,
    LABEL_TASK,
    PodSettings,
    coordinator_pod,
    job_secret,
    job_secret_name,
    leader_service,
    leader_service_name,
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
    standby: bool = False  # made for the next run while this one runs (`task_pod`)
    exit_code: int | None = None  # of its container, once terminated
    message: str = ""  # the container's termination message (the end of its log, when it failed)
    leader: bool = False  # labelled as the leading coordinator (the leader Service's endpoint)


def pod_view(pod: dict[str, Any]) -> PodView:
    """A pod's role, run, task, phase and readiness."""
    meta, status = pod["metadata"], pod.get("status") or {}
    labels = meta.get("labels") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    run = labels.get(LABEL_RUN)
    terminated: dict[str, Any] = next(
        (
            c["state"]["terminated"]
            for c in status.get("containerStatuses") or []
            if "terminated" in c.get("state", {})
        ),
        {},
    )
    return PodView(
        name=meta["name"],
        role=labels.get(LABEL_ROLE, ""),
        run=int(run) if run else None,
        task=labels.get(LABEL_TASK),
        phase=status.get("phase", "Pending"),
        ready=conditions.get("Ready") == "True",
        deleting=bool(meta.get("deletionTimestamp")),
        fingerprint=(meta.get("annotations") or {}).get(ANNOTATION_FINGERPRINT),
        standby=labels.get(LABEL_STANDBY) == "true",
        exit_code=terminated.get("exitCode"),
        message=terminated.get("message") or "",
        leader=labels.get(LABEL_LEADER) == "true",
    )


@dataclass(frozen=True)
class Observed:
    """One StreamJob and its world, as one pass saw them."""

    job: dict[str, Any]
    pods: dict[str, PodView]
    model: StreamModel | None = None
    """The job's spec, typed, once it is known to be valid."""
    etcd_seen: JobInEtcd | None = None
    """The job in etcd, read once its deployed plan (and so its keys) is known."""

    @property
    def spec(self) -> StreamModel:
        """The job's valid spec, typed (read only after the pass validated it)."""
        assert self.model is not None, "the spec is read once it is valid"
        return self.model

    @property
    def etcd(self) -> JobInEtcd:
        """The job in etcd, as this pass read it."""
        assert self.etcd_seen is not None, "etcd is read once the deployed plan is known"
        return self.etcd_seen

    @property
    def status(self) -> StreamJobStatus:
        """The job's status (empty before the first pass)."""
        return StreamJobStatus.read(self.job.get("status"))

    @property
    def run(self) -> int:
        """The run the job's pods belong to (recorded by the first pass)."""
        run = self.status.run
        assert run is not None, "a deployed job has a run"
        return run


@dataclass
class Context:
    """What the passes over one job share: clients, pod settings, events, plans read so far."""

    kube: Kube
    etcd: EtcdView
    pods: PodSettings
    emit: Emit
    plans: dict[str, tuple[PartitionedPlan, DeploymentPlan]] = field(default_factory=dict)
    clock: Callable[[], float] = time.time  # wall seconds: the restart policy's window and backoff


def observe(ctx: Context, namespace: str, name: str) -> Observed | None:
    """Read the job and its pods (None when the job is gone or being deleted); change nothing."""
    job = ctx.kube.job(namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return None
    job_id = (job.get("spec") or {}).get("jobId") or name
    pods = {p.name: p for p in map(pod_view, ctx.kube.pods(namespace, job_id))}
    return Observed(job, pods)


def validate(job: dict[str, Any], *, allowed_secrets: frozenset[str] | None = None) -> compiler.CompiledPlans:
    """Compile the StreamJob for Kubernetes; ModelError lists every issue (as `nopstream validate`).

    With `allowed_secrets` (the chart's `jobs.allowedSecrets`), a `secretRef` to any other
    Secret is an issue: the operator would mount it into pods that run the job's image.
    """
    return _compiled(job, allowed_secrets)[1]


def _compiled(
    job: dict[str, Any], allowed_secrets: frozenset[str] | None
) -> tuple[StreamModel, compiler.CompiledPlans]:
    """The StreamJob's typed spec and its plans (`validate`)."""
    namespace = job["metadata"]["namespace"]
    loaded = load_data(job, origin=f"streamjob/{job['metadata']['name']}")
    plans = compiler.compile_model(loaded, backend="kubernetes", namespace=namespace)
    if allowed_secrets is not None:
        issues = _secret_issues(loaded, allowed_secrets)
        if issues:
            raise ModelError(issues)
    return loaded.model, plans


def _secret_issues(loaded: LoadedModel, allowed: frozenset[str]) -> list[Issue]:
    """An issue for every `secretRef` of the job that names a Secret not in `allowed`."""
    model = loaded.model
    refs: list[tuple[tuple[str | int, ...], str | None]] = []
    if model.checkpoint.storage.s3 is not None:
        refs.append((("checkpoint", "storage", "s3", "secretRef"), model.checkpoint.storage.s3.secret_ref))
    connectors: list[tuple[str, Sequence[SourceSpec | SinkSpec]]] = [
        ("sources", model.graph.sources),
        ("sinks", model.graph.sinks),
    ]
    for section, nodes in connectors:
        for i, node in enumerate(nodes):
            refs.append((("model", section, i, "config", "secretRef"), node.config.get("secretRef")))
    shown = ", ".join(sorted(allowed)) or "none"
    return [
        Issue(
            loaded.path(*at),
            f"Secret '{name}' is not one a StreamJob may mount (allowed: {shown}; the chart's"
            " jobs.allowedSecrets)",
            "secret-allowed",
        )
        for at, name in refs
        if isinstance(name, str) and name not in allowed
    ]


def reconcile_once(ctx: Context, namespace: str, name: str) -> None:
    """One whole pass over one StreamJob."""
    seen = observe(ctx, namespace, name)
    if seen is None:
        return
    try:
        model, desired = _compiled(seen.job, ctx.pods.allowed_secrets)
    except ModelError as err:
        _invalid(ctx, seen, [str(i) for i in err.issues])
        return
    seen = dataclasses.replace(seen, model=model)
    if seen.status.plan_fingerprint is None:
        _first_deploy(ctx, seen, desired)
        return
    partitioned, deployment = _deployed_plans(ctx, seen)
    seen = dataclasses.replace(seen, etcd_seen=ctx.etcd.observe(_layout(deployment)))
    if seen.spec.suspend:
        _suspend(ctx, seen, deployment)
        return
    if seen.status.phase == "Suspended":
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
        ready = next((c for c in seen.status.conditions if c.type == "Ready"), None)
        if ready is None or ready.reason != "NameConflict":
            ctx.emit(seen.job, "Warning", "NameConflict", message)
        conditions = with_condition(seen.status.conditions, "Ready", "False", "NameConflict", message)
        _patch(ctx, seen, phase="Pending", conditions=conditions)


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


def _has_condition(conditions: list[Condition], kind: str, reason: str) -> bool:
    """Whether condition `kind` holds with this reason."""
    return any(c.type == kind and c.reason == reason for c in conditions)


def _patch(ctx: Context, seen: Observed, **changes: Any) -> None:
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


def _invalid(ctx: Context, seen: Observed, messages: list[str]) -> None:
    text = "; ".join(messages)
    if seen.status.phase != "Invalid":
        ctx.emit(seen.job, "Warning", "Invalid", text)
    conditions = with_condition(seen.status.conditions, "Valid", "False", "ValidationFailed", text)
    _patch(ctx, seen, phase="Invalid", conditions=conditions)


def _first_deploy(ctx: Context, seen: Observed, desired: compiler.CompiledPlans) -> None:
    """Store the plan, take the next run in etcd, and record both (the pods come next pass)."""
    deployment = desired.deployment
    name = plan_configmap_name(deployment.job_id, deployment.partitioned_fingerprint)
    if not ctx.kube.exists("ConfigMap", deployment.namespace, name):
        ctx.kube.create(plan_configmap(seen.job, desired.partitioned, deployment))
    layout = _layout(deployment)
    nonce = seen.spec.restart_nonce
    # a new lineage unless storage's lineage was started by this nonce already
    request = RestoreRequest(NewLineage(nonce)) if nonce else None
    run = ctx.etcd.advance_run(layout, ctx.etcd.run(layout), restore=request)
    conditions = with_condition(
        seen.status.conditions, "Valid", "True", "Compiled", deployment.partitioned_fingerprint
    )
    _patch(
        ctx,
        seen,
        phase="Pending",
        run=run,
        recoveries=0,
        failed_at=[],
        plan_fingerprint=deployment.partitioned_fingerprint,
        semantic_mode=desired.partitioned.identity.semantic_mode.value,
        restart_nonce=nonce,
        tasks_total=len(deployment.tasks),
        tasks_ready=0,
        observed_generation=seen.job["metadata"].get("generation"),
        conditions=conditions,
    )
    ctx.emit(seen.job, "Normal", "Deploying", f"plan {deployment.partitioned_fingerprint[:19]}, run {run}")


def _layout(deployment: DeploymentPlan) -> Layout:
    return Layout(deployment.namespace, deployment.job_id, deployment.pipeline_id)


def _deployed_plans(ctx: Context, seen: Observed) -> tuple[PartitionedPlan, DeploymentPlan]:
    """The plans the running pods use, from their ConfigMap (read once per fingerprint)."""
    fp = seen.status.plan_fingerprint
    assert fp is not None, "a deployed job has a plan"
    if fp not in ctx.plans:
        meta = seen.job["metadata"]
        job_id = seen.spec.job_id or meta["name"]
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
    drop_state = seen.spec.drop_state
    verdict = compat.check_compatibility(deployed, desired.partitioned, drop_state=drop_state)
    fp = desired.deployment.partitioned_fingerprint
    reasons = "; ".join(str(r) for r in verdict.reasons)
    if verdict.change is compat.ChangeKind.REFUSED:
        message = f"the change to plan {fp[:19]} is refused: {reasons}"
        conditions = with_condition(seen.status.conditions, "SpecChange", "False", "Refused", message)
        if seen.status.rejected_fingerprint != fp:
            ctx.emit(seen.job, "Warning", "SpecChangeRefused", message)
        _patch(ctx, seen, conditions=conditions, rejected_fingerprint=fp)
        return False
    return _upgrade(ctx, seen, deployment, desired, f"{verdict.change.name}: {reasons}")


def _upgrade(
    ctx: Context, seen: Observed, deployment: DeploymentPlan, desired: compiler.CompiledPlans, why: str
) -> bool:
    """Stop with a savepoint, then redeploy the new plan from it; each step recorded in status first."""
    layout = _layout(deployment)
    fp = desired.deployment.partitioned_fingerprint
    run = seen.run
    conditions = with_condition(seen.status.conditions, "SpecChange", "True", "StoppingWithSavepoint", why)
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
    request = RestoreRequest(from_plan=deployment.partitioned_fingerprint)
    new_run = ctx.etcd.advance_run(layout, run, restore=request)
    conditions = with_condition(
        seen.status.conditions, "SpecChange", "True", "Redeployed", f"from savepoint {stop}"
    )
    _patch(
        ctx,
        seen,
        phase="Upgrading",
        run=new_run,
        plan_fingerprint=fp,
        stopping=None,
        tasks_total=len(desired.deployment.tasks),
        tasks_ready=0,
        observed_generation=seen.job["metadata"].get("generation"),
        conditions=conditions,
    )
    ctx.emit(
        seen.job,
        "Normal",
        "Savepoint",
        f"stop savepoint {stop} of plan {deployment.partitioned_fingerprint[:19]}",
    )
    ctx.emit(seen.job, "Normal", "Upgraded", f"run {new_run} starts plan {fp[:19]} from savepoint {stop}")
    _delete_pods(ctx.kube, ns, seen.pods.values())
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
    run = seen.run
    stopping = seen.status.stopping
    if stopping is None or stopping.purpose != purpose:
        stopping = Stopping(purpose=purpose, after=seen.etcd.last_epoch)
        _patch(ctx, seen, **first, stopping=stopping)
        ctx.emit(seen.job, "Normal", *event)
    stop = seen.etcd.stopped_at(after=stopping.after)
    if stop is None and stopping.requested_in_run != run and _request_savepoint(ctx, seen, layout, stop=True):
        _patch(ctx, seen, stopping=stopping.model_copy(update={"requested_in_run": run}))
    return stop


def _ensure_fences(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """The job's Secret, NetworkPolicy and leader Service exist (created, owned by the job, when missing)."""
    ns, name = deployment.namespace, job_secret_name(deployment.job_id)
    if ctx.kube.owned_secret(ns, name, JOB_SECRET_KEY, seen.job["metadata"]["uid"]) is None:
        ctx.kube.create(job_secret(seen.job, deployment, guard.new_secret()))
    policy = network_policy_name(deployment.job_id)
    if ctx.pods.network_policy and not ctx.kube.exists("NetworkPolicy", ns, policy):
        ctx.kube.create(network_policy(seen.job, deployment, ctx.pods))
    if not ctx.kube.exists("Service", ns, leader_service_name(deployment.job_id)):
        ctx.kube.create(leader_service(seen.job, deployment))


def _label_leader(ctx: Context, seen: Observed, deployment: DeploymentPlan, leader: str | None) -> None:
    """Only the coordinator pod that leads (as etcd says) carries the leader label."""
    for pod in seen.pods.values():
        if pod.role == "coordinator" and pod.leader != (pod.name == leader) and not pod.deleting:
            value = "true" if pod.name == leader else None
            ctx.kube.label_pod(deployment.namespace, pod.name, {LABEL_LEADER: value})


def _request_savepoint(ctx: Context, seen: Observed, layout: Layout, *, stop: bool) -> bool:
    """Ask the leading coordinator for a savepoint (`stop`: and stop at it); whether it took the request."""
    endpoint = seen.etcd.leader_endpoint
    uid = seen.job["metadata"]["uid"]
    secret = ctx.kube.owned_secret(layout.namespace, job_secret_name(layout.job_id), JOB_SECRET_KEY, uid)
    if endpoint is None or secret is None:
        return False
    try:
        CoordinatorClient(endpoint, secret, timeout=5).savepoint(stop=stop)
    except CoordinatorError:
        return False
    return True


def _suspend(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """spec.suspend: stop with a savepoint, then remove every pod; phase Suspended."""
    if seen.status.phase != "Suspended":
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
        conditions = with_condition(
            seen.status.conditions, "Ready", "False", "Suspended", f"at savepoint {stop}"
        )
        _patch(ctx, seen, phase="Suspended", suspended_at=stop, stopping=None, conditions=conditions)
        ctx.emit(seen.job, "Normal", "Suspended", f"at savepoint {stop}; the pods are removed")
    _delete_pods(ctx.kube, deployment.namespace, seen.pods.values())


def _resume(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """spec.suspend back to false: a new run, which restores the savepoint it stopped at."""
    stop = seen.status.suspended_at
    new_run = ctx.etcd.advance_run(_layout(deployment), seen.run)
    _patch(ctx, seen, phase="Pending", run=new_run, suspended_at=None, tasks_ready=0)
    ctx.emit(seen.job, "Normal", "Resumed", f"run {new_run} restores savepoint {stop}")


def _restart_nonce(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> bool:
    """A new spec.restartNonce starts the job over: a new run in a new lineage that restores nothing.

    Recorded in status first; the new run's restore point in etcd asks its coordinator
    for the new lineage (started once per nonce, so a repeated pass changes nothing);
    then every pod goes, coordinators too (a finished job's have completed).
    """
    nonce = seen.spec.restart_nonce
    if not nonce or nonce == seen.status.restart_nonce:
        return False
    layout = _layout(deployment)
    run = seen.run
    new_run = ctx.etcd.advance_run(layout, run, restore=RestoreRequest(NewLineage(nonce)))
    conditions = with_condition(
        seen.status.conditions, "Ready", "False", "Restarting", f"restart nonce {nonce}"
    )
    _patch(
        ctx,
        seen,
        phase="Pending",
        run=new_run,
        restart_nonce=nonce,
        recoveries=0,
        failed_at=[],
        tasks_ready=0,
        stopping=None,
        conditions=conditions,
    )
    ctx.emit(seen.job, "Normal", "Restarted", f"run {new_run} starts a new lineage (restart nonce {nonce})")
    _delete_pods(ctx.kube, deployment.namespace, seen.pods.values())
    return True


def _savepoint_nonce(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """A new spec.savepointNonce asks for a savepoint; the next committed one carries the nonce."""
    nonce = seen.spec.savepoint_nonce
    if not nonce or nonce == seen.status.savepoint_nonce:
        return
    layout = _layout(deployment)
    after = seen.etcd.last_epoch
    if _request_savepoint(ctx, seen, layout, stop=False):
        _patch(ctx, seen, savepoint_nonce=nonce, savepoint_request=SavepointRequest(nonce=nonce, after=after))
        ctx.emit(seen.job, "Normal", "SavepointRequested", f"nonce {nonce}")


def _savepoints(
    ctx: Context, seen: Observed, epochs: list[int]
) -> tuple[list[Savepoint], SavepointRequest | None]:
    """The committed savepoints, with the nonces that asked for them; the request still open (if any)."""
    known = {s.epoch: s.nonce for s in seen.status.savepoints}
    request = seen.status.savepoint_request
    out = []
    for epoch in epochs:
        nonce = known.get(epoch)
        if nonce is None and request is not None and epoch > request.after:
            nonce, request = request.nonce, None
            ctx.emit(seen.job, "Normal", "Savepoint", f"savepoint {epoch} (nonce {nonce})")
        out.append(Savepoint(epoch=epoch, nonce=nonce))
    return out, request


def _reconcile_pods(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """Coordinators present, old runs gone, the current run whole (or recovered), status current."""
    if seen.status.phase == "Failed":
        return  # its pods are gone; a spec change or a new StreamJob starts it again
    ns, run = deployment.namespace, seen.run
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
    standbys = {p.task: p for p in tasks if _next_runs_standby(seen, deployment, p)}
    for pod in tasks:
        if pod.run != run and not pod.deleting and standbys.get(pod.task) is not pod:
            ctx.kube.delete_pod(ns, pod.name, grace=0)
    current = {p.task: p for p in tasks if p.run == run}
    if seen.status.phase == "Succeeded":
        return
    lost = [p.name for p in current.values() if p.phase == "Failed" or p.deleting]
    if seen.status.deployed_run == run:
        lost += [task_pod_name(t, run) + " (gone)" for t in deployment.tasks if t.name not in current]
    refused = next((p for p in current.values() if p.exit_code in REFUSED_EXITS), None)
    if refused is not None:  # the same in every run: not recovered
        last = _last_line(refused.message)
        refusal = Refusal.from_exit(refused.exit_code, last)
        reason = "BadInput" if refusal is not None and refusal.kind == "input" else "CannotStart"
        said = last.removeprefix(TASK_LINE) or f"exit code {refused.exit_code}"
        _fail(ctx, seen, deployment, reason, f"{refused.name}: {said}")
        return
    if lost:
        # the last line of a failed task's log: its error, with the user's file and line
        why = next(
            (_last_line(p.message) for p in current.values() if p.phase == "Failed" and p.message.strip()), ""
        )
        _recover(
            ctx,
            seen,
            deployment,
            run,
            f"{', '.join(sorted(lost))} failed" + (f": {why}" if why else ""),
            current,
        )
        return
    stored = seen.etcd.run
    if stored < run:  # lost coordination state: a new run past it, never a run reused
        lost_state = f"etcd lost the job's coordination state (its run reads {stored}, the run is {run})"
        _recover(ctx, seen, deployment, run, lost_state, current)
        return
    for t in deployment.tasks:
        if t.name not in current:
            ctx.kube.create(task_pod(seen.job, deployment, t, run, ctx.pods))
    running = _refresh(ctx, seen, deployment, current) == "Running"
    if running and _standby_tasks(seen) and health.committed_since_ready(seen.status):
        # Made once the run has committed an epoch (a recovery's start and first output
        # have the cores first: standbys starting beside it slowed it by seconds on two
        # cores, even between its first durable epoch and that epoch's commit), once per
        # run: one that failed stays, and is not adopted, until the next run replaces it,
        # so a standby that cannot start never churns pods.
        for t in deployment.tasks:
            if t.name not in standbys:
                ctx.kube.create(task_pod(seen.job, deployment, t, run + 1, ctx.pods, standby=True))


def _standby_tasks(seen: Observed) -> bool:
    """Whether the job keeps a standby pod per task for the next run (spec.standbyTasks)."""
    return seen.spec.standby_tasks


def _next_runs_standby(seen: Observed, deployment: DeploymentPlan, pod: PodView) -> bool:
    """Whether `pod` is a standby of this plan for the next run, kept while the job goes on."""
    return (
        _standby_tasks(seen)
        and pod.standby
        and pod.run == seen.run + 1
        and pod.fingerprint == deployment.partitioned_fingerprint
        and seen.status.phase != "Succeeded"
    )


def _fail(ctx: Context, seen: Observed, deployment: DeploymentPlan, reason: str, message: str) -> None:
    """Phase Failed for `reason`: its pods go, its checkpoints stay (a spec change can start it again)."""
    conditions = with_condition(seen.status.conditions, "Ready", "False", reason, message)
    _patch(ctx, seen, phase="Failed", tasks_ready=0, conditions=conditions)
    ctx.emit(seen.job, "Warning", "Failed", message)
    _delete_pods(ctx.kube, deployment.namespace, seen.pods.values())


@dataclass
class _PodSteps:
    """A global recovery of a job's pods (`node.recovery`).

    The new run goes into etcd and the status first, then the old run's pods are
    deleted and the new run's created (a pass cut short is finished by the next one,
    which creates whatever of the run is missing).
    """

    ctx: Context
    seen: Observed
    deployment: DeploymentPlan
    current: dict[str | None, PodView]

    def advance(self, run: int) -> int:
        nonce = self.seen.status.restart_nonce
        layout = _layout(self.deployment)
        # a lineage the failed run may not have started yet (once per nonce: harmless after)
        request = RestoreRequest(NewLineage(nonce)) if nonce else None
        # the standby pods of this plan waiting for the new run serve it (`start` adopts them)
        takeover = self.deployment.partitioned_fingerprint
        return self.ctx.etcd.advance_run(layout, run, takeover=takeover, restore=request)

    def record(self, recovered: recovery.Recovery) -> None:
        message = f"{recovered.message}: restoring the latest durable epoch"
        conditions = with_condition(self.seen.status.conditions, "Ready", "False", "Recovering", message)
        _patch(
            self.ctx,
            self.seen,
            run=recovered.run,
            phase="Recovering",
            recoveries=recovered.recoveries,
            failed_at=[int(t * 1000) for t in recovered.failures],
            tasks_ready=0,
            conditions=conditions,
        )
        self.ctx.emit(self.seen.job, "Warning", "Recovery", message)

    def stop(self, run: int) -> None:
        _delete_pods(self.ctx.kube, self.deployment.namespace, self.current.values())
        # A coordinator that saw the final epoch committed has completed (exit 0, not
        # restarted); a task lost after that still needs the new run led (its restore point
        # says finished, its tasks publish what they hold and exit): the next pass recreates it.
        for name in self.deployment.coordinators:
            coordinator = self.seen.pods.get(name)
            if coordinator is not None and coordinator.phase == "Succeeded" and not coordinator.deleting:
                self.ctx.kube.delete_pod(self.deployment.namespace, name, grace=0)

    def start(self, run: int, *, delay_s: float) -> None:
        """Create the run's task pods now (the backoff was waited before the recovery began, see
        `_recover`): waiting a pass would add its period to every recovery.

        A standby holding a pod's name is adopted as it is, unless it failed (then it is
        replaced).
        """
        ns = self.deployment.namespace
        for task in self.deployment.tasks:
            standby = self.seen.pods.get(task_pod_name(task, run))
            if standby is not None and (standby.phase not in ("Pending", "Running") or standby.deleting):
                self.ctx.kube.delete_pod(ns, standby.name, grace=0)
            self.ctx.kube.create(task_pod(self.seen.job, self.deployment, task, run, self.ctx.pods))


def _delete_pods(kube: Kube, namespace: str, pods: Iterable[PodView]) -> None:
    """Delete each of `pods` not being deleted already, at once (grace 0: its processes are crash-only)."""
    for pod in pods:
        if not pod.deleting:
            kube.delete_pod(namespace, pod.name, grace=0)


def _last_line(message: str) -> str:
    """The last line of a container's termination message ('' for none)."""
    lines = message.strip().splitlines()
    return lines[-1] if lines else ""


def _recover(
    ctx: Context,
    seen: Observed,
    deployment: DeploymentPlan,
    run: int,
    cause: str,
    current: dict[str | None, PodView],
) -> None:
    """A global recovery from `cause` (`node.recovery`); past spec.maxRecoveries failures within
    the restart policy's window the job is Failed instead.

    The window is `status.failedAt`. A pass cannot wait in place, so the backoff is
    waited before the recovery begins: a failure that comes quicker than its delay after
    the one before is recovered from by the first pass past it (passes come every second).
    """
    policy = recovery.RestartPolicy(max_failures=seen.spec.max_recoveries)
    failures, now = [t / 1000 for t in seen.status.failed_at], ctx.clock()
    if policy.wait(failures, now) > 0:
        return
    try:
        recovery.recover(
            _PodSteps(ctx, seen, deployment, current),
            run=run,
            recoveries=seen.status.recoveries or 0,
            failures=failures,
            now=now,
            policy=policy,
            cause=cause,
        )
    except recovery.TooManyRecoveries as failed:
        _fail(ctx, seen, deployment, "TooManyRecoveries", f"{failed}: the job has failed")


def _refresh(
    ctx: Context,
    seen: Observed,
    deployment: DeploymentPlan,
    current: dict[str | None, PodView],
) -> str | None:
    """The run's pods all created: phase, readiness and epochs from what was observed; the phase."""
    total = len(deployment.tasks)
    ready = sum(1 for p in current.values() if p.ready and p.phase == "Running")
    succeeded = len(current) == total and all(p.phase == "Succeeded" for p in current.values())
    phase = seen.status.phase
    conditions = seen.status.conditions
    epochs = seen.etcd.summary
    _label_leader(ctx, seen, deployment, epochs.leader[0] if epochs.leader else None)
    if succeeded:
        phase = "Succeeded"
        conditions = with_condition(conditions, "Ready", "False", "Succeeded", "the final epoch is committed")
    elif ready == total and seen.status.stopping is None:  # stopping: still Upgrading
        phase = "Running"
        checkpoint = deployment.checkpoint
        if health.stalled(checkpoint, conditions, epochs.durable_at, now=health.now_ms()):
            message = health.stalled_message(checkpoint, epochs.durable)
            if not _has_condition(conditions, "Ready", health.STALLED):
                ctx.emit(seen.job, "Warning", health.STALLED, message)
            conditions = with_condition(conditions, "Ready", "False", health.STALLED, message)
        else:
            message = f"{ready}/{total} tasks ready"
            conditions = with_condition(conditions, "Ready", "True", "AllTasksReady", message)
    savepoints, request = _savepoints(ctx, seen, list(epochs.savepoints))
    if phase != seen.status.phase and phase in ("Running", "Succeeded"):
        ctx.emit(seen.job, "Normal", phase, f"run {seen.run}: {ready}/{total} tasks ready")
    _patch(
        ctx,
        seen,
        deployed_run=seen.run,
        phase=phase,
        tasks_ready=ready,
        tasks_total=total,
        latest_durable_epoch=epochs.durable,
        latest_durable_at=None if epochs.durable_at is None else health.rfc3339(epochs.durable_at),
        latest_committed_epoch=epochs.committed,
        latest_committed_at=None if epochs.committed_at is None else health.rfc3339(epochs.committed_at),
        pending_commits=list(epochs.pending_commits),
        leader=None if epochs.leader is None else Leader(pod=epochs.leader[0], token=epochs.leader[1]),
        savepoints=savepoints,
        savepoint_request=request,
        conditions=conditions,
    )
    return phase


def cleanup(kube: Kube, namespace: str, job_id: str) -> None:
    """The job is deleted: its pods, plan ConfigMaps, Secret, Service, NetworkPolicy go; checkpoints stay."""
    _delete_pods(kube, namespace, map(pod_view, kube.pods(namespace, job_id)))
    kube.delete_configmaps(namespace, job_id)
    kube.delete("Secret", namespace, job_secret_name(job_id))
    kube.delete("NetworkPolicy", namespace, network_policy_name(job_id))
    kube.delete("Service", namespace, leader_service_name(job_id))
