"""What a pass does to a run's pods, decided from what it observed alone: no I/O here.

`decide_pods` reads the pods and the job in etcd as `observed` saw them and says which
coordinators to create, which pods to delete or to label with the run they serve, and how
the run stands: refused (the same in every run: the job fails), lost (a global
recovery), or whole once its missing task pods are created. `reconcile.reconcile_pods`
carries the decision out. The run's pods are those its serving map names (a recovery
keeps the pods that still run, `node.resident`), or without one those made for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nopstream.errors import REFUSED_EXITS, TASK_LINE, Refusal
from nopstream.plan.deployment import DeploymentPlan, TaskDeployment
from nopstream_operator.observed import Observed, PodView
from nopstream_operator.resources import task_pod_name


@dataclass(frozen=True)
class Refused:
    """A task refused to start (bad input, a missing secret): no run would start it."""

    reason: str
    message: str


@dataclass(frozen=True)
class Lost:
    """The run lost a task pod or its coordination state: a global recovery from `cause`."""

    cause: str


@dataclass(frozen=True)
class Whole:
    """Nothing lost: the run goes on once its missing task pods are created."""

    missing: tuple[TaskDeployment, ...]


@dataclass(frozen=True)
class RunPods:
    """The decision over a run's pods."""

    create_coordinators: tuple[str, ...]
    delete: tuple[str, ...]
    """Pods deleted at once: failed or outdated coordinators, task pods that do not serve the run
    (standbys kept)."""
    relabel: tuple[str, ...]
    """Pods kept from an earlier run, to be labelled with the run they serve."""
    current: dict[str | None, PodView]
    """The run's task pods by task, as observed."""
    standbys: frozenset[str | None]
    """The tasks that have a standby pod for the next run."""
    outcome: Refused | Lost | Whole | None
    """How the run stands; None once it succeeded (nothing more to do)."""


REPORT_GRACE_S = 3.0
"""A task process's failure report alone recovers the job this long after it was written: when a pod
dies, its peers' task processes fail and report at once, and the dead pod shows as failed or gone
only after its kubelet's relist (every second) and status update. A recovery before that would
keep the dead pod, and its death would be a second recovery."""


def decide_pods(seen: Observed, deployment: DeploymentPlan, *, now: float) -> RunPods:
    """Coordinators present, old runs gone, the current run whole or recovered: what to do for it (`now`:
    wall seconds, the failure reports' clock)."""
    run = seen.run
    create, delete = [], []
    for name in deployment.coordinators:
        pod = seen.pods.get(name)
        if pod is None:
            create.append(name)
        elif pod.node_lost or (
            (pod.phase == "Failed" or pod.fingerprint != deployment.partitioned_fingerprint)
            and not pod.deleting
        ):
            delete.append(name)
    tasks = [p for p in seen.pods.values() if p.role == "task"]
    standbys = {p.task: p for p in tasks if next_runs_standby(seen, deployment, p)}
    current = _current(seen, tasks)
    serving = {p.name for p in current.values()}
    delete += [
        p.name
        for p in tasks
        if p.name not in serving and (not p.deleting or p.node_lost) and standbys.get(p.task) is not p
    ]
    relabel = tuple(p.name for p in current.values() if p.run != run and not p.deleting)
    outcome = None if seen.status.phase == "Succeeded" else _outcome(seen, deployment, current, now)
    return RunPods(tuple(create), tuple(delete), relabel, current, frozenset(standbys), outcome)


def _current(seen: Observed, tasks: list[PodView]) -> dict[str | None, PodView]:
    """The run's task pods by task: those its serving map names, or without one those made for it."""
    serving = _serving(seen)
    if serving is None:
        return {p.task: p for p in tasks if p.run == seen.run}
    named = set(serving.values())
    return {p.task: p for p in tasks if p.name in named}


def _serving(seen: Observed) -> Mapping[str, str] | None:
    """The serving map of the run the job's pods belong to (None without one, or when etcd's run is
    another: its map is not this run's)."""
    return seen.etcd.serving if seen.etcd.run == seen.run else None


def keeps(pod: PodView, deployment: DeploymentPlan) -> bool:
    """Whether a recovery keeps this task pod of the failed run: it runs this plan and can serve the
    next run (`node.resident`), so no new pod has to start."""
    return (
        pod.resident
        and pod.phase == "Running"
        and not pod.deleting
        and not pod.node_lost
        and pod.fingerprint == deployment.partitioned_fingerprint
    )


def _outcome(
    seen: Observed, deployment: DeploymentPlan, current: dict[str | None, PodView], now: float
) -> Refused | Lost | Whole:
    """Refused, lost or whole, in that order: a refusal is not recovered from; failure reports of
    kept pods are a loss with a pod's, or alone once one is REPORT_GRACE_S old."""
    run = seen.run
    refused = next((p for p in current.values() if p.exit_code in REFUSED_EXITS), None)
    if refused is not None:
        last = last_line(refused.message)
        refusal = Refusal.from_exit(refused.exit_code, last)
        reason = "BadInput" if refusal is not None and refusal.kind == "input" else "CannotStart"
        said = last.removeprefix(TASK_LINE) or f"exit code {refused.exit_code}"
        return Refused(reason, f"{refused.name}: {said}")
    lost = [p.name for p in current.values() if (p.phase == "Failed" or p.deleting) and not p.node_lost]
    lost += [f"{p.name} (its node {p.node} is lost)" for p in current.values() if p.node_lost]
    serving = _serving(seen)
    named = {t.name: (serving or {}).get(t.task_id, task_pod_name(t, run)) for t in deployment.tasks}
    # a kept pod that is gone is not made again: the next run hands its task to a new one
    gone = [t for t in deployment.tasks if t.name not in current]
    if seen.status.deployed_run != run:
        gone = [t for t in gone if named[t.name] != task_pod_name(t, run)]
    lost += [f"{named[t.name]} (gone)" for t in gone]
    pods = {p.name for p in current.values()}
    reports = [r for r in seen.etcd.failed.values() if seen.etcd.run == run and r.attempt in pods]
    if lost or any(now - r.at_ms / 1000 >= REPORT_GRACE_S for r in reports):
        lost += [f"{r.attempt} (its task process, exit code {r.exit_code})" for r in reports]
    if lost:
        # the last line of a failed task's log: its error, with the user's file and line
        why = next(
            (last_line(p.message) for p in current.values() if p.phase == "Failed" and p.message.strip()), ""
        )
        return Lost(f"{', '.join(sorted(lost))} failed" + (f": {why}" if why else ""))
    stored = seen.etcd.run
    if stored < run:  # lost coordination state: a new run past it, never a run reused
        return Lost(f"etcd lost the job's coordination state (its run reads {stored}, the run is {run})")
    return Whole(tuple(t for t in deployment.tasks if t.name not in current))


def next_runs_standby(seen: Observed, deployment: DeploymentPlan, pod: PodView) -> bool:
    """Whether `pod` is a standby of this plan for the next run, kept while the job goes on."""
    return (
        seen.spec.standby_tasks
        and pod.standby
        and pod.run == seen.run + 1
        and pod.fingerprint == deployment.partitioned_fingerprint
        and seen.status.phase != "Succeeded"
        and not pod.node_lost
    )


def last_line(message: str) -> str:
    """The last line of a container's termination message ('' for none)."""
    lines = message.strip().splitlines()
    return lines[-1] if lines else ""
