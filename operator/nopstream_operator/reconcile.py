"""One pass over one StreamJob: observe, validate, reconcile (the Flink operator's loop).

`observed.observe` reads the StreamJob, its pods and (once its plan is known) the job in
etcd, and changes nothing. `observed.validate` is the compiler's validation, the same
function as `nopstream validate`. `decide` says what a run's pods need from the observation
alone; the pass here carries it out, `acts` writes status, Events and pod deletions,
`changes` answers changes of the spec. Its status is a write-ahead log:
the target run and plan are recorded in status before any pod is touched, so a pass
interrupted anywhere is finished by the next. A pass over a job whose world is as it should be writes nothing.

Runs: status `run` is the run the pods belong to; `deployedRun` says every pod of that
run was created. A task pod that failed, is being deleted, or (once deployed) is
missing is a global recovery: `run` advances by compare-and-swap in etcd, the new
run is recorded in status, then the old run's pods are deleted and the new run's are
created. A coordinator pod's loss is not a recovery: it is recreated, and the
standby leads meanwhile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from nopstream.checkpoint.restore import NewLineage, RestoreRequest
from nopstream.model.errors import ModelError
from nopstream.model.status import (
    Leader,
    Savepoint,
    SavepointRequest,
)
from nopstream.node import recovery
from nopstream.node.wire import authority, guard
from nopstream.plan.deployment import DeploymentPlan, TaskDeployment
from nopstream_operator import health
from nopstream_operator.acts import delete_pods, fail, has_condition, invalid, patch, waits, with_condition
from nopstream_operator.changes import (
    first_deploy,
    restart_nonce,
    resume,
    savepoint_nonce,
    spec_change,
    suspend,
)
from nopstream_operator.claims import holds_checkpoints, release
from nopstream_operator.decide import Lost, Refused, Whole, decide_pods, keeps
from nopstream_operator.kube import EtcdView, Kube, NameTaken
from nopstream_operator.observed import (
    Context,
    Observed,
    PodView,
    compiled,
    deployed_plans,
    job_layout,
    observe,
    pod_view,
)
from nopstream_operator.resources import (
    LABEL_LEADER,
    LABEL_RUN,
    coordinator_pod,
    job_secret,
    job_secret_name,
    leader_service,
    leader_service_name,
    network_policy,
    network_policy_name,
    plan_configmap_name,
    task_pod,
    task_pod_name,
)

SETTLED_PHASES = frozenset({"Succeeded", "Failed", "Invalid", "Suspended"})
"""Phases a job stays in until its spec changes."""


def reconcile_once(ctx: Context, namespace: str, name: str) -> bool:
    """One whole pass over one StreamJob; whether the job is settled: in a SETTLED_PHASES phase when
    the pass began, and the pass wrote nothing."""
    seen = observe(ctx, namespace, name)
    if seen is None:
        return False
    writes = ctx.kube.writes
    _reconcile(ctx, seen)
    return seen.status.phase in SETTLED_PHASES and ctx.kube.writes == writes


def _reconcile(ctx: Context, seen: Observed) -> None:
    """The pass over the job `seen`."""
    try:
        model, desired = compiled(seen.job, ctx.pods.allowed_secrets)
    except ModelError as err:
        invalid(ctx, seen, [str(i) for i in err.issues])
        return
    seen = dataclasses.replace(seen, model=model)
    if not holds_checkpoints(ctx, seen, desired):
        return
    if seen.status.plan_fingerprint is None:
        first_deploy(ctx, seen, desired)
        return
    partitioned, deployment = deployed_plans(ctx, seen)
    seen = dataclasses.replace(seen, etcd_seen=ctx.etcd.observe(job_layout(deployment)))
    if seen.spec.suspend:
        if not suspend(ctx, seen, deployment):
            reconcile_pods(ctx, seen, deployment)  # recoveries go on until the savepoint
        return
    if seen.status.phase == "Suspended":
        resume(ctx, seen, deployment)
        return
    if restart_nonce(ctx, seen, deployment):
        return  # restarted: the next pass starts the new run's pods
    changed = desired.deployment.partitioned_fingerprint != deployment.partitioned_fingerprint
    if changed and spec_change(ctx, seen, partitioned, deployment, desired):
        return  # redeployed: the next pass starts the new plan's pods
    savepoint_nonce(ctx, seen, deployment)
    try:
        reconcile_pods(ctx, seen, deployment)
    except NameTaken as taken:  # nothing of the other owner's is touched; this job waits for the name
        waits(ctx, seen, "NameConflict", f"{taken}: remove it or rename this job")


def _ensure_fences(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """The job's Secret, NetworkPolicy and leader Service exist (created, owned by the job, when missing)."""
    ns, name = deployment.namespace, job_secret_name(deployment.job_id)
    if ctx.kube.owned_secret(ns, name, seen.job["metadata"]["uid"]) is None:
        ctx.kube.create(
            job_secret(seen.job, deployment, guard.new_secret(), authority.issue(deployment.job_id))
        )
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


def reconcile_pods(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """Carry out `decide.decide_pods`: coordinators present, old runs gone, the current run whole (or
    recovered), status current."""
    if seen.status.phase == "Failed":
        return  # its pods are gone; a spec change or a new StreamJob starts it again
    ns, run = deployment.namespace, seen.run
    if not ctx.kube.exists(
        "ConfigMap", ns, plan_configmap_name(deployment.job_id, deployment.partitioned_fingerprint)
    ):
        raise RuntimeError("the deployed plan's ConfigMap is gone")
    _ensure_fences(ctx, seen, deployment)  # before any pod mounts the secret or listens
    pods = decide_pods(seen, deployment, now=ctx.clock())
    for name in pods.create_coordinators:
        ctx.kube.create(coordinator_pod(seen.job, deployment, name, ctx.pods))
    for name in pods.delete:
        ctx.kube.delete_pod(ns, name, grace=0)
    for name in pods.relabel:
        ctx.kube.label_pod(ns, name, {LABEL_RUN: str(run)})
    match pods.outcome:
        case Refused(reason, message):
            fail(ctx, seen, deployment, reason, message)
        case Lost(cause):
            _recover(ctx, seen, deployment, run, cause, pods.current)
        case Whole(missing):
            for task in missing:
                ctx.kube.create(task_pod(seen.job, deployment, task, run, ctx.pods))
            running = _refresh(ctx, seen, deployment, pods.current) == "Running"
            if running and seen.spec.standby_tasks and health.committed_since_ready(seen.status):
                # Made once the run has committed an epoch (a recovery's start and first output
                # have the cores first: standbys starting beside it slowed it by seconds on two
                # cores, even between its first durable epoch and that epoch's commit), once per
                # run: one that failed stays, and is not adopted, until the next run replaces it,
                # so a standby that cannot start never churns pods.
                for task in deployment.tasks:
                    if task.name not in pods.standbys:
                        ctx.kube.create(task_pod(seen.job, deployment, task, run + 1, ctx.pods, standby=True))


@dataclass
class _PodSteps:
    """A global recovery of a job's pods (`node.recovery`).

    The new run goes into etcd and the status first, with the pod that serves each of its
    tasks: a task pod of the failed run that still runs (`decide.keeps`: its process serves
    the new run, `node.resident`), else the pod made for the new run (a standby of that name
    is adopted). Then the old run's other pods are deleted, the kept ones labelled with the
    new run, and the missing ones created (a pass cut short is finished by the next one,
    which does whatever of this is left).
    """

    ctx: Context
    seen: Observed
    deployment: DeploymentPlan
    current: dict[str | None, PodView]
    serving: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The entered run's pod of each task (by id), as etcd holds it once the run advanced."""
    silent: frozenset[str] = frozenset()
    """Pods the recovery would keep that did not answer (`nodes.silent`): made anew, off their nodes."""

    def advance(self, run: int) -> int:
        nonce = self.seen.status.restart_nonce
        layout = job_layout(self.deployment)
        # a lineage the failed run may not have started yet (once per nonce: harmless after)
        request = RestoreRequest(NewLineage(nonce)) if nonce else None
        self.silent = self.ctx.silent([p for p in self.current.values() if keeps(p, self.deployment)])
        serving = {t.task_id: self._pod_for(t, run + 1) for t in self.deployment.tasks}
        entered = self.ctx.etcd.advance_run(layout, run, serving=serving, restore=request)
        # another pass may have entered it first: what etcd holds is what the pods follow
        self.serving = self.ctx.etcd.serving(layout, entered) or {}
        return entered

    def _pod_for(self, task: TaskDeployment, run: int) -> str:
        """The pod that serves `task` in the new run `run`: its pod of the failed run when that one is
        kept, else the one made for `run`."""
        pod = self.current.get(task.name)
        if pod is not None and keeps(pod, self.deployment) and pod.name not in self.silent:
            return pod.name
        return task_pod_name(task, run)

    def record(self, recovered: recovery.Recovery) -> None:
        message = f"{recovered.message}: restoring the latest durable epoch"
        if self.silent:
            message += f"; not kept, as they do not answer: {', '.join(sorted(self.silent))}"
        conditions = with_condition(self.seen.status.conditions, "Ready", "False", "Recovering", message)
        patch(
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
        kept = set(self.serving.values())
        # with the old run's pods go the standbys the new run did not need (its other pods were kept)
        standbys = (p for p in self.seen.pods.values() if p.standby and p.run is not None and p.run > run)
        unneeded = [p for p in (*self.current.values(), *standbys) if p.name not in kept]
        delete_pods(self.ctx.kube, self.deployment.namespace, unneeded)
        # A coordinator that saw the final epoch committed has completed (exit 0, not
        # restarted); a task lost after that still needs the new run led (its restore point
        # says finished, its tasks publish what they hold and exit): the next pass recreates it.
        for name in self.deployment.coordinators:
            coordinator = self.seen.pods.get(name)
            if coordinator is not None and coordinator.phase == "Succeeded" and not coordinator.deleting:
                self.ctx.kube.delete_pod(self.deployment.namespace, name, grace=0)

    def start(self, run: int, *, delay_s: float) -> None:
        """Label the kept pods with `run` and create the others now (the backoff was waited before the
        recovery began, see `_recover`): waiting a pass would add its period to every recovery.

        A standby holding a pod's name is adopted as it is, unless it failed or its node is
        lost (then it is replaced).
        """
        ns = self.deployment.namespace
        avoid = frozenset(p.node for p in self.current.values() if p.name in self.silent and p.node)
        for task in self.deployment.tasks:
            name = task_pod_name(task, run)
            if self.serving.get(task.task_id, name) != name:
                self.ctx.kube.label_pod(ns, self.serving[task.task_id], {LABEL_RUN: str(run)})
                continue
            standby = self.seen.pods.get(name)
            if standby is not None and (
                standby.phase not in ("Pending", "Running") or standby.deleting or standby.node_lost
            ):
                self.ctx.kube.delete_pod(ns, standby.name, grace=0)
            self.ctx.kube.create(
                task_pod(self.seen.job, self.deployment, task, run, self.ctx.pods, avoid=avoid)
            )


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
        fail(ctx, seen, deployment, "TooManyRecoveries", f"{failed}: the job has failed")


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
            if not has_condition(conditions, "Ready", health.STALLED):
                ctx.emit(seen.job, "Warning", health.STALLED, message)
            conditions = with_condition(conditions, "Ready", "False", health.STALLED, message)
        else:
            message = f"{ready}/{total} tasks ready"
            conditions = with_condition(conditions, "Ready", "True", "AllTasksReady", message)
    savepoints, request = _savepoints(ctx, seen, list(epochs.savepoints))
    if phase != seen.status.phase and phase in ("Running", "Succeeded"):
        ctx.emit(seen.job, "Normal", phase, f"run {seen.run}: {ready}/{total} tasks ready")
    patch(
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


def cleanup(kube: Kube, etcd: EtcdView, namespace: str, job_id: str, uid: str) -> None:
    """The job is deleted: its pods, plan ConfigMaps, Secret, Service, NetworkPolicy and claims on
    checkpoint namespaces go; checkpoints stay."""
    release(etcd, uid)
    delete_pods(kube, namespace, map(pod_view, kube.pods(namespace, job_id)))
    kube.delete_configmaps(namespace, job_id)
    kube.delete("Secret", namespace, job_secret_name(job_id))
    kube.delete("NetworkPolicy", namespace, network_policy_name(job_id))
    kube.delete("Service", namespace, leader_service_name(job_id))
