"""DeploymentPlan: where each task of a PartitionedPlan runs and what it is bound to.

Two backends of the same plan: `kubernetes` (one pod per task, endpoints from the pod
IP, etcd coordination) and `local` (one process per task, or one process for all with
`--in-process`; loopback endpoints with ports chosen at start, the in-process lease
backend). Distributed semantics never depend on which one runs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from nopstream.model.spec import StreamModel
from nopstream.plan.canonical import fingerprint
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.plan.streamgraph import FORMAT_VERSION

TASK_PORT = 7700
METRICS_PORT = 9400
COORDINATOR_REPLICAS = 2
_MAX_NAME = 63
_HASH_CHARS = 10
_PLAIN_PART = re.compile(r"^[a-z0-9]+$")


@dataclass(frozen=True)
class StorageBinding:
    """The checkpoint storage root: a local directory or an S3 bucket and prefix."""

    kind: str
    path: str | None
    endpoint: str | None
    bucket: str | None
    prefix: str | None
    secret_ref: str | None


@dataclass(frozen=True)
class CheckpointSettings:
    """How the coordinator paces epochs and how many durable epochs are kept."""

    interval_ms: int
    timeout_ms: int
    retain_latest: int


@dataclass(frozen=True)
class Resources:
    """Kubernetes resource requests and limits of a pod."""

    requests: dict[str, str]
    limits: dict[str, str]


@dataclass(frozen=True)
class TaskDeployment:
    """One task: its identity, its pod (or process) name and its endpoint template."""

    task_id: str
    vertex_id: str
    subtask: int
    name: str
    endpoint: str


@dataclass(frozen=True)
class DeploymentPlan:
    """Everything a backend needs to start the tasks and coordinators of one plan."""

    format_version: int
    backend: str
    transport: str
    partitioned_fingerprint: str
    job_id: str
    pipeline_id: str
    namespace: str
    etcd_prefix: str
    storage: StorageBinding
    checkpoint: CheckpointSettings
    image: str
    resources: Resources
    tasks: tuple[TaskDeployment, ...]
    coordinators: tuple[str, ...]


def resource_name(*parts: str) -> str:
    """A DNS-1123 label naming exactly one tuple of parts: `a-b-c`, or `a-b-c--{hash}`.

    Parts of lower-case letters and digits only are joined by '-' (splitting on '-' gives
    them back). Any other tuple (a part holding '-' itself, or a name past 63 characters)
    gets '--' and a hash of the exact parts, which no plain name contains: so job `a-b`
    with vertex `c` and job `a` with vertex `b-c` never share a pod name.
    """
    name = "-".join(parts)
    if len(name) <= _MAX_NAME and all(_PLAIN_PART.match(p) for p in parts):
        return name
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:_HASH_CHARS]
    prefix = re.sub(r"[^a-z0-9-]", "-", name.lower())[: _MAX_NAME - _HASH_CHARS - 2].strip("-")
    return f"{prefix}--{digest}"


def build_deployment_plan(
    model: StreamModel,
    plan: PartitionedPlan,
    *,
    backend: str,
    namespace: str,
    transport: str = "http",
) -> DeploymentPlan:
    """Bind a PartitionedPlan to a backend: names, endpoints, storage, etcd prefix, image."""
    ident = plan.identity
    local = backend == "local"
    tasks = tuple(
        TaskDeployment(
            task_id=s.task_id,
            vertex_id=v.vertex_id,
            subtask=s.index,
            name=resource_name(ident.job_id, v.vertex_id, str(s.index)),
            endpoint="http://127.0.0.1:{port}" if local else f"http://{{podIP}}:{TASK_PORT}",
        )
        for v in plan.vertices
        for s in v.subtasks
    )
    storage = model.checkpoint.storage
    if storage.s3 is not None:
        binding = StorageBinding(
            "s3",
            None,
            storage.s3.endpoint,
            storage.s3.bucket,
            storage.s3.prefix,
            storage.s3.secret_ref,
        )
    else:
        path = storage.local.path if storage.local is not None else ""
        binding = StorageBinding("local", path, None, None, None, None)
    cp = model.checkpoint
    return DeploymentPlan(
        format_version=FORMAT_VERSION,
        backend=backend,
        transport=transport,
        partitioned_fingerprint=fingerprint(plan),
        job_id=ident.job_id,
        pipeline_id=ident.pipeline_id,
        namespace=namespace,
        etcd_prefix=f"/nopstream/{namespace}/{ident.job_id}/{ident.pipeline_id}/",
        storage=binding,
        checkpoint=CheckpointSettings(cp.interval_ms, cp.timeout_ms, cp.retain_latest),
        image=model.image,
        resources=Resources(dict(model.resources.requests), dict(model.resources.limits)),
        tasks=tasks,
        coordinators=tuple(
            resource_name(ident.job_id, "coordinator", str(i))
            for i in range(1 if local else COORDINATOR_REPLICAS)
        ),
    )
