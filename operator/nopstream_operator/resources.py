"""The Kubernetes objects of a job, built from its plans: pure functions, no API calls.

A job's plans live in an immutable ConfigMap per plan (`{jobId}-plan-{fingerprint}`),
mounted into every pod at PLAN_MOUNT. Task pods are named `{task name}-r{run}` and
never restart (a task failure is a global recovery); coordinator pods are named by
the DeploymentPlan and restart on failure (the standby leads meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nopstream.model.connectors import SECRETS_DIR
from nopstream.plan import compiler
from nopstream.plan.deployment import TASK_PORT, DeploymentPlan, TaskDeployment
from nopstream.plan.partitioned import PartitionedPlan

GROUP = "nopstream.io"
VERSION = "v1alpha1"
PLURAL = "streamjobs"
PLAN_MOUNT = "/etc/nopstream/plan"
LABEL_JOB = "nopstream.io/job"
LABEL_ROLE = "nopstream.io/role"
LABEL_RUN = "nopstream.io/run"
LABEL_VERTEX = "nopstream.io/vertex"
LABEL_SUBTASK = "nopstream.io/subtask"
LABEL_TASK = "nopstream.io/task"
ANNOTATION_FINGERPRINT = "nopstream.io/plan-fingerprint"
MANAGED = {"app.kubernetes.io/name": "nopstream", "app.kubernetes.io/managed-by": "nopstream-operator"}


@dataclass(frozen=True)
class PodSettings:
    """How the operator's pods start and reach etcd (from the operator's environment)."""

    etcd: str
    command: tuple[str, ...] = ("nopstream",)
    extra_env: dict[str, str] = field(default_factory=dict)
    lease_ttl: int = 10


def plan_configmap_name(job_id: str, fingerprint: str) -> str:
    """The ConfigMap holding one plan of a job."""
    return f"{job_id}-plan-{fingerprint.removeprefix('sha256:')[:10]}"


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """The StreamJob as the controlling owner of what the operator creates."""
    meta = job["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StreamJob",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def plan_configmap(
    job: dict[str, Any], partitioned: PartitionedPlan, deployment: DeploymentPlan
) -> dict[str, Any]:
    """The immutable ConfigMap of a plan: both documents, the fingerprint in an annotation."""
    fp = deployment.partitioned_fingerprint
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": plan_configmap_name(deployment.job_id, fp),
            "namespace": deployment.namespace,
            "labels": {**MANAGED, LABEL_JOB: deployment.job_id, LABEL_ROLE: "plan"},
            "annotations": {ANNOTATION_FINGERPRINT: fp},
            "ownerReferences": [owner_reference(job)],
        },
        "immutable": True,
        "data": {
            "partitioned.json": compiler.dump_document(partitioned),
            "deployment.json": compiler.dump_document(deployment),
        },
    }


def _env(deployment: DeploymentPlan, settings: PodSettings, extra: dict[str, str]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "NOPSTREAM_PLAN_DIR", "value": PLAN_MOUNT},
        {"name": "NOPSTREAM_ETCD", "value": settings.etcd},
        {"name": "NOPSTREAM_ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NOPSTREAM_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NOPSTREAM_ADVERTISE", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NOPSTREAM_PORT", "value": str(TASK_PORT)},
        {"name": "NOPSTREAM_LEASE_TTL", "value": str(settings.lease_ttl)},
    ]
    env += [{"name": k, "value": v} for k, v in sorted(extra.items())]
    secret = deployment.storage.secret_ref
    if secret:
        for name, key in (("NOPSTREAM_S3_ACCESS_KEY", "accessKey"), ("NOPSTREAM_S3_SECRET_KEY", "secretKey")):
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    env += [{"name": k, "value": v} for k, v in sorted(settings.extra_env.items())]
    return env


def _pod(
    job: dict[str, Any],
    deployment: DeploymentPlan,
    settings: PodSettings,
    *,
    name: str,
    role: str,
    labels: dict[str, str],
    env: dict[str, str],
    restart: str,
) -> dict[str, Any]:
    # A TCP probe: the kernel accepts while the process listens, even when a user
    # function holds the record loop for a while (an HTTP probe would time out then).
    probe = {"tcpSocket": {"port": TASK_PORT}, "periodSeconds": 5, "failureThreshold": 3}
    resources = {
        k: v
        for k, v in (("requests", deployment.resources.requests), ("limits", deployment.resources.limits))
        if v
    }
    secrets = connector_secrets(job)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": deployment.namespace,
            "labels": {**MANAGED, LABEL_JOB: deployment.job_id, LABEL_ROLE: role, **labels},
            "annotations": {ANNOTATION_FINGERPRINT: deployment.partitioned_fingerprint},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "restartPolicy": restart,
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
            "containers": [
                {
                    "name": role,
                    "image": deployment.image,
                    "command": [*settings.command, role],
                    "env": _env(deployment, settings, env),
                    "ports": [{"name": "http", "containerPort": TASK_PORT}],
                    "readinessProbe": {**probe, "initialDelaySeconds": 1},
                    "livenessProbe": {**probe, "initialDelaySeconds": 10},
                    "resources": resources,
                    "volumeMounts": [
                        {"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
                        *(
                            {"name": f"secret-{i}", "mountPath": f"{SECRETS_DIR}/{s}", "readOnly": True}
                            for i, s in enumerate(secrets)
                        ),
                    ],
                }
            ],
            "volumes": [
                {
                    "name": "plan",
                    "configMap": {
                        "name": plan_configmap_name(deployment.job_id, deployment.partitioned_fingerprint)
                    },
                },
                *({"name": f"secret-{i}", "secret": {"secretName": s}} for i, s in enumerate(secrets)),
            ],
        },
    }


def connector_secrets(job: dict[str, Any]) -> list[str]:
    """The Secrets the job's sources and sinks name by `secretRef`, mounted at SECRETS_DIR in every pod."""
    model = (job.get("spec") or {}).get("model") or {}
    refs = {
        str(node["config"]["secretRef"])
        for section in ("sources", "sinks")
        for node in model.get(section) or []
        if isinstance(node, dict) and isinstance(node.get("config"), dict) and node["config"].get("secretRef")
    }
    return sorted(refs)


def task_pod_name(task: TaskDeployment, run: int) -> str:
    """A task's pod in a run."""
    return f"{task.name}-r{run}"


def task_pod(
    job: dict[str, Any], deployment: DeploymentPlan, task: TaskDeployment, run: int, settings: PodSettings
) -> dict[str, Any]:
    """The pod of one task in one run: never restarted (its failure is a global recovery)."""
    return _pod(
        job,
        deployment,
        settings,
        name=task_pod_name(task, run),
        role="task",
        labels={
            LABEL_RUN: str(run),
            LABEL_VERTEX: task.vertex_id,
            LABEL_SUBTASK: str(task.subtask),
            LABEL_TASK: task.name,
        },
        env={"NOPSTREAM_TASK_ID": task.task_id, "NOPSTREAM_RUN": str(run)},
        restart="Never",
    )


def coordinator_pod(
    job: dict[str, Any], deployment: DeploymentPlan, name: str, settings: PodSettings
) -> dict[str, Any]:
    """A coordinator candidate's pod: restarted on failure; a clean exit means the job is over."""
    return _pod(
        job, deployment, settings, name=name, role="coordinator", labels={}, env={}, restart="OnFailure"
    )
