"""What one pass reads: the StreamJob, its pods, its plans and the job in etcd, typed, changing nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nopstream.cluster.layout import Layout
from nopstream.model.errors import Issue, ModelError
from nopstream.model.load import LoadedModel, load_data
from nopstream.model.spec import StreamModel, secret_refs
from nopstream.model.status import (
    StreamJobStatus,
)
from nopstream.plan import compiler
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan
from nopstream_operator.kube import EtcdView, JobInEtcd, Kube
from nopstream_operator.resources import (
    ANNOTATION_FINGERPRINT,
    LABEL_LEADER,
    LABEL_RESIDENT,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_STANDBY,
    LABEL_TASK,
    PodSettings,
    plan_configmap_name,
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
    resident: bool = False  # its process serves any run it is handed: a recovery may keep it
    exit_code: int | None = None  # of its container, once terminated
    message: str = ""  # the container's termination message (the end of its log, when it failed)
    leader: bool = False  # labelled as the leading coordinator (the leader Service's endpoint)
    node: str = ""  # the node it is bound to ('' before it is scheduled)
    node_lost: bool = False  # that node is lost (`nodes`): the pod is replaced, not waited for
    ip: str = ""  # its address on the pod network ('' before it has one)


def pod_view(pod: dict[str, Any], lost_nodes: frozenset[str] = frozenset()) -> PodView:
    """A pod's role, run, task, phase and readiness, and whether its node is one of `lost_nodes`."""
    meta, status = pod["metadata"], pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName") or ""
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
        resident=labels.get(LABEL_RESIDENT) == "true",
        exit_code=terminated.get("exitCode"),
        message=terminated.get("message") or "",
        leader=labels.get(LABEL_LEADER) == "true",
        node=node,
        node_lost=node in lost_nodes,
        ip=status.get("podIP") or "",
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
    lost_nodes: Callable[[], frozenset[str]] = frozenset  # the node watch's (`nodes.LostNodes.names`)
    silent: Callable[[Sequence[PodView]], frozenset[str]] = lambda pods: frozenset()
    """Which of these running pods do not answer on the pod network (`nodes.silent`); none here."""


def observe(ctx: Context, namespace: str, name: str) -> Observed | None:
    """Read the job and its pods (None when the job is gone or being deleted); change nothing."""
    job = ctx.kube.job(namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return None
    job_id = (job.get("spec") or {}).get("jobId") or name
    lost = ctx.lost_nodes()
    pods = {p.name: p for p in (pod_view(pod, lost) for pod in ctx.kube.pods(namespace, job_id))}
    return Observed(job, pods)


def validate(job: dict[str, Any], *, allowed_secrets: frozenset[str] | None = None) -> compiler.CompiledPlans:
    """Compile the StreamJob for Kubernetes; ModelError lists every issue (as `nopstream validate`).

    With `allowed_secrets` (the chart's `jobs.allowedSecrets`), a `secretRef` to any other
    Secret is an issue: the operator would mount it into pods that run the job's image.
    """
    return compiled(job, allowed_secrets)[1]


def compiled(
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
    shown = ", ".join(sorted(allowed)) or "none"
    return [
        Issue(
            loaded.path(*at),
            f"Secret '{name}' is not one a StreamJob may mount (allowed: {shown}; the chart's"
            " jobs.allowedSecrets)",
            "secret-allowed",
        )
        for at, name in secret_refs(loaded.model)
        if name not in allowed
    ]


def job_layout(deployment: DeploymentPlan) -> Layout:
    return Layout(deployment.namespace, deployment.job_id, deployment.pipeline_id)


def deployed_plans(ctx: Context, seen: Observed) -> tuple[PartitionedPlan, DeploymentPlan]:
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
