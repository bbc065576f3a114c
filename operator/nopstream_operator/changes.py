"""A pass's answers to a change of the spec: the first deploy, upgrades and rescales from a stop savepoint,
suspend and resume, a restart or savepoint asked for by nonce."""

from __future__ import annotations

from typing import Any

from nopstream.checkpoint.restore import NewLineage, RestoreRequest
from nopstream.cluster.layout import Layout
from nopstream.model.status import (
    SavepointRequest,
    Stopping,
)
from nopstream.plan import compat, compiler
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan
from nopstream_operator.acts import delete_pods, patch, request_savepoint, with_condition
from nopstream_operator.observed import Context, Observed, job_layout
from nopstream_operator.resources import (
    plan_configmap,
    plan_configmap_name,
)


def first_deploy(ctx: Context, seen: Observed, desired: compiler.CompiledPlans) -> None:
    """Store the plan, take the next run in etcd, and record both (the pods come next pass)."""
    deployment = desired.deployment
    name = plan_configmap_name(deployment.job_id, deployment.partitioned_fingerprint)
    if not ctx.kube.exists("ConfigMap", deployment.namespace, name):
        ctx.kube.create(plan_configmap(seen.job, desired.partitioned, deployment))
    layout = job_layout(deployment)
    nonce = seen.spec.restart_nonce
    # a new lineage unless storage's lineage was started by this nonce already
    request = RestoreRequest(NewLineage(nonce)) if nonce else None
    run = ctx.etcd.advance_run(layout, ctx.etcd.run(layout), restore=request)
    conditions = with_condition(
        seen.status.conditions, "Valid", "True", "Compiled", deployment.partitioned_fingerprint
    )
    patch(
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


def spec_change(
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
        patch(ctx, seen, conditions=conditions, rejected_fingerprint=fp)
        return False
    return _upgrade(ctx, seen, deployment, desired, f"{verdict.change.name}: {reasons}")


def _upgrade(
    ctx: Context, seen: Observed, deployment: DeploymentPlan, desired: compiler.CompiledPlans, why: str
) -> bool:
    """Stop with a savepoint, then redeploy the new plan from it; each step recorded in status first."""
    layout = job_layout(deployment)
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
    patch(
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
    delete_pods(ctx.kube, ns, seen.pods.values())
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
        patch(ctx, seen, **first, stopping=stopping)
        ctx.emit(seen.job, "Normal", *event)
    stop = seen.etcd.stopped_at(after=stopping.after)
    if stop is None and stopping.requested_in_run != run and request_savepoint(ctx, seen, layout, stop=True):
        patch(ctx, seen, stopping=stopping.model_copy(update={"requested_in_run": run}))
    return stop


def suspend(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> bool:
    """spec.suspend: stop with a savepoint, then remove every pod; phase Suspended. False while the
    savepoint is still to come (the run's pods are reconciled meanwhile: recoveries go on)."""
    if seen.status.phase != "Suspended":
        stop = _stop_with_savepoint(
            ctx,
            seen,
            job_layout(deployment),
            "suspend",
            {},
            ("Suspend", "stopping with a savepoint, then removing the pods"),
        )
        if stop is None:
            return False
        conditions = with_condition(
            seen.status.conditions, "Ready", "False", "Suspended", f"at savepoint {stop}"
        )
        patch(ctx, seen, phase="Suspended", suspended_at=stop, stopping=None, conditions=conditions)
        ctx.emit(seen.job, "Normal", "Suspended", f"at savepoint {stop}; the pods are removed")
    delete_pods(ctx.kube, deployment.namespace, seen.pods.values())
    return True


def resume(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """spec.suspend back to false: a new run, which restores the savepoint it stopped at."""
    stop = seen.status.suspended_at
    new_run = ctx.etcd.advance_run(job_layout(deployment), seen.run)
    patch(ctx, seen, phase="Pending", run=new_run, suspended_at=None, tasks_ready=0)
    ctx.emit(seen.job, "Normal", "Resumed", f"run {new_run} restores savepoint {stop}")


def restart_nonce(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> bool:
    """A new spec.restartNonce starts the job over: a new run in a new lineage that restores nothing.

    Recorded in status first; the new run's restore point in etcd asks its coordinator
    for the new lineage (started once per nonce, so a repeated pass changes nothing);
    then every pod goes, coordinators too (a finished job's have completed).
    """
    nonce = seen.spec.restart_nonce
    if not nonce or nonce == seen.status.restart_nonce:
        return False
    layout = job_layout(deployment)
    run = seen.run
    new_run = ctx.etcd.advance_run(layout, run, restore=RestoreRequest(NewLineage(nonce)))
    conditions = with_condition(
        seen.status.conditions, "Ready", "False", "Restarting", f"restart nonce {nonce}"
    )
    patch(
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
    delete_pods(ctx.kube, deployment.namespace, seen.pods.values())
    return True


def savepoint_nonce(ctx: Context, seen: Observed, deployment: DeploymentPlan) -> None:
    """A new spec.savepointNonce asks for a savepoint; the next committed one carries the nonce."""
    nonce = seen.spec.savepoint_nonce
    if not nonce or nonce == seen.status.savepoint_nonce:
        return
    layout = job_layout(deployment)
    after = seen.etcd.last_epoch
    if request_savepoint(ctx, seen, layout, stop=False):
        patch(ctx, seen, savepoint_nonce=nonce, savepoint_request=SavepointRequest(nonce=nonce, after=after))
        ctx.emit(seen.job, "Normal", "SavepointRequested", f"nonce {nonce}")
