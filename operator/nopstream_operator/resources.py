"""The Kubernetes objects of a job, built from its plans: pure functions, no API calls.

A job's plans live in an immutable ConfigMap per plan (`{jobId}-plan-{fingerprint}`),
mounted into every pod at PLAN_MOUNT; its secret (`node.wire.guard`) in a Secret
(`{jobId}-secret`) mounted at JOB_SECRET_MOUNT, the checkpoint storage's credentials
(its `secretRef`) at STORAGE_CREDENTIALS_MOUNT: files, never environment variables.
Task pods are named `{task name}-r{run}` and never restart (a task failure is a
global recovery); coordinator pods are named by the DeploymentPlan and restart on
failure (the standby leads meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nopstream.model.connectors import SECRETS_DIR
from nopstream.model.load import load_data
from nopstream.model.spec import secret_refs
from nopstream.node.settings import ADVERTISE, ATTEMPT, HOST, SECRET_FILE, NodeEnv
from nopstream.node.wire.tls import JobCertificate
from nopstream.plan import compiler
from nopstream.plan.deployment import TASK_PORT, DeploymentPlan, TaskDeployment, resource_name
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.s3 import CREDENTIALS_ENV

GROUP = "nopstream.io"
VERSION = "v1alpha1"
PLURAL = "streamjobs"
PLAN_MOUNT = "/etc/nopstream/plan"
JOB_SECRET_MOUNT = SECRET_FILE.rpartition("/")[0]
JOB_SECRET_KEY = SECRET_FILE.rpartition("/")[2]
STORAGE_CREDENTIALS_MOUNT = "/var/run/nopstream/storage"
ETCD_ACCESS_MOUNT = "/var/run/nopstream/etcd-access"
LABEL_JOB = "nopstream.io/job"
LABEL_ROLE = "nopstream.io/role"
LABEL_RUN = "nopstream.io/run"
LABEL_VERTEX = "nopstream.io/vertex"
LABEL_SUBTASK = "nopstream.io/subtask"
LABEL_TASK = "nopstream.io/task"
LABEL_STANDBY = "nopstream.io/standby"
LABEL_RESIDENT = "nopstream.io/resident"  # "true": its process serves any run it is handed (`node.resident`)
LABEL_LEADER = "nopstream.io/leader"  # "true" on the coordinator pod that leads: the Service's one endpoint
ANNOTATION_FINGERPRINT = "nopstream.io/plan-fingerprint"
HEALTH_PORT = 7701
"""Where a pod's process answers its liveness probe (`nopstream.node.liveness`)."""
POD_USER = 10001
"""The uid and group of every process in a job's pods (never root; the image's USER)."""
MANAGED = {"app.kubernetes.io/name": "nopstream", "app.kubernetes.io/managed-by": "nopstream-operator"}


@dataclass(frozen=True)
class PodSettings:
    """How the operator's pods start and reach etcd (from the operator's environment)."""

    etcd: str
    command: tuple[str, ...] = ("nopstream",)
    extra_env: dict[str, str] = field(default_factory=dict)
    lease_ttl: int = 10
    network_policy: bool = True
    operator_namespace: str | None = None
    ingress_from: tuple[dict[str, Any], ...] = ()  # more NetworkPolicy peers (a Prometheus, say)
    allowed_secrets: frozenset[str] | None = None  # the Secrets a secretRef may name (None: any)
    etcd_access_secret: str | None = None  # TLS and credentials to etcd (`cluster.etcd_access`)


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
            **_metadata(job, deployment, plan_configmap_name(deployment.job_id, fp), "plan"),
            "annotations": {ANNOTATION_FINGERPRINT: fp},
        },
        "immutable": True,
        "data": {
            "partitioned.json": compiler.dump_document(partitioned),
            "deployment.json": compiler.dump_document(deployment),
        },
    }


def _metadata(job: dict[str, Any], deployment: DeploymentPlan, name: str, role: str) -> dict[str, Any]:
    """Name, namespace, labels and the StreamJob as owner of one of the job's objects."""
    return {
        "name": name,
        "namespace": deployment.namespace,
        "labels": {**MANAGED, LABEL_JOB: deployment.job_id, LABEL_ROLE: role},
        "ownerReferences": [owner_reference(job)],
    }


def job_secret_name(job_id: str) -> str:
    """The Secret holding a job's secret."""
    return resource_name(job_id, "secret")


def job_secret(
    job: dict[str, Any], deployment: DeploymentPlan, secret: str, certificate: JobCertificate
) -> dict[str, Any]:
    """The Secret of a job's secret and TLS files (`node.wire.tls`), owned by its StreamJob (deleted with
    it)."""
    files = {name: data.decode() for name, data in certificate.files().items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(job, deployment, job_secret_name(deployment.job_id), "secret"),
        "type": "Opaque",
        "immutable": True,
        "stringData": {JOB_SECRET_KEY: secret, **files},
    }


def network_policy_name(job_id: str) -> str:
    """The NetworkPolicy that fences a job's pods."""
    return resource_name(job_id, "peers")


def network_policy(job: dict[str, Any], deployment: DeploymentPlan, settings: PodSettings) -> dict[str, Any]:
    """Ingress to the job's pods only from pods of the same job and from the operator (and `ingress_from`).

    One per job: a NetworkPolicy selects peers by label values and within its own
    namespace, so "the same job" cannot be written once for every job.
    """
    peers: list[dict[str, Any]] = [{"podSelector": {"matchLabels": {LABEL_JOB: deployment.job_id}}}]
    if settings.operator_namespace:
        peers.append(
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}
                },
                "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
            }
        )
    peers += settings.ingress_from
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, deployment, network_policy_name(deployment.job_id), "network-policy"),
        "spec": {
            "podSelector": {"matchLabels": {**MANAGED, LABEL_JOB: deployment.job_id}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": TASK_PORT}]}],
        },
    }


def leader_service_name(job_id: str) -> str:
    """The Service that routes to the job's leading coordinator."""
    return resource_name(job_id, "leader")


def leader_service(job: dict[str, Any], deployment: DeploymentPlan) -> dict[str, Any]:
    """A Service whose one endpoint is the leading coordinator: its dashboard, API and metrics.

    The operator labels the leader's pod (`LABEL_LEADER`) from the election in etcd at
    every pass; a standby coordinator is never an endpoint.
    """
    selector = {LABEL_JOB: deployment.job_id, LABEL_ROLE: "coordinator", LABEL_LEADER: "true"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, deployment, leader_service_name(deployment.job_id), "leader"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": TASK_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _env(deployment: DeploymentPlan, settings: PodSettings, node: NodeEnv) -> list[dict[str, Any]]:
    """The container's environment: the node's variables, its name and address from the pod's fields."""
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in node.to_env().items()]
    env += [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in ((ATTEMPT, "metadata.name"), (HOST, "status.podIP"), (ADVERTISE, "status.podIP"))
    ]
    if deployment.storage.secret_ref:
        env.append({"name": CREDENTIALS_ENV, "value": STORAGE_CREDENTIALS_MOUNT})
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
    restart: str,
    task_id: str | None = None,
    run: int | None = None,
    standby: bool = False,
) -> dict[str, Any]:
    # Readiness is a TCP probe: the kernel accepts while the process listens, even when a
    # user function holds the record loop for a while (an HTTP probe would time out then).
    # Liveness asks the process's own liveness thread (`node.liveness`): a TCP probe
    # passes for a stopped process too (the kernel completes the handshake), and a task
    # that is stopped or wedged must fail its pod so that the job recovers.
    # The startup probe holds the others off until the process first listens (up to
    # 2 minutes): on a busy node a start can take longer than a liveness probe allows,
    # and killing it there only starts another recovery on the same busy node.
    readiness = {"tcpSocket": {"port": TASK_PORT}, "periodSeconds": 5, "failureThreshold": 3}
    node = NodeEnv(
        plan_dir=PLAN_MOUNT,
        etcd=settings.etcd,
        lease_ttl=settings.lease_ttl,
        secret_file=SECRET_FILE,
        tls=True,
        etcd_access=ETCD_ACCESS_MOUNT if settings.etcd_access_secret else None,
        port=TASK_PORT,
        health_port=HEALTH_PORT,
        task_id=task_id,
        run=run,
        standby=standby,
        resident=role == "task",
    )
    liveness = {
        "httpGet": {"path": "/healthz", "port": HEALTH_PORT},
        "periodSeconds": 5,
        "timeoutSeconds": 2,
        "failureThreshold": 3,
        # a stopped process holds SIGTERM pending: the pod's 30 s grace would only delay the recovery
        "terminationGracePeriodSeconds": 1,
    }
    startup = {"tcpSocket": {"port": TASK_PORT}, "periodSeconds": 1, "failureThreshold": 120}
    resources = {
        k: v
        for k, v in (("requests", deployment.resources.requests), ("limits", deployment.resources.limits))
        if v
    }
    secrets = connector_secrets(job)
    storage = deployment.storage.secret_ref
    credentials = {"name": "storage-credentials", "mountPath": STORAGE_CREDENTIALS_MOUNT, "readOnly": True}
    etcd_access = {"name": "etcd-access", "mountPath": ETCD_ACCESS_MOUNT, "readOnly": True}
    mounts = [
        {"name": "scratch", "mountPath": "/tmp"},  # the root filesystem is read-only
        {"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
        {"name": "job-secret", "mountPath": JOB_SECRET_MOUNT, "readOnly": True},
        *([credentials] if storage else []),
        *([etcd_access] if settings.etcd_access_secret else []),
        *(
            {"name": f"secret-{i}", "mountPath": f"{SECRETS_DIR}/{s}", "readOnly": True}
            for i, s in enumerate(secrets)
        ),
    ]
    volumes = [
        {
            "name": "plan",
            "configMap": {"name": plan_configmap_name(deployment.job_id, deployment.partitioned_fingerprint)},
        },
        {"name": "job-secret", "secret": {"secretName": job_secret_name(deployment.job_id)}},
        *([{"name": "storage-credentials", "secret": {"secretName": storage}}] if storage else []),
        *(
            [{"name": "etcd-access", "secret": {"secretName": settings.etcd_access_secret}}]
            if settings.etcd_access_secret
            else []
        ),
        {"name": "scratch", "emptyDir": {"sizeLimit": "256Mi"}},
        *(connector_secret_volume(f"secret-{i}", s) for i, s in enumerate(secrets)),
    ]
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
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": POD_USER,
                "fsGroup": POD_USER,  # the group of the mounted Secrets' files
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": role,
                    "image": deployment.image,
                    "command": [*settings.command, role],
                    "env": _env(deployment, settings, node),
                    "ports": [{"name": "http", "containerPort": TASK_PORT}],
                    # a refused start tells why in its last log line: the operator reads it there
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "startupProbe": startup,
                    "readinessProbe": readiness,
                    "livenessProbe": liveness,
                    "resources": resources,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                    },
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        },
    }


def connector_secret_volume(volume: str, secret: str) -> dict[str, Any]:
    """A volume of a connector's Secret: root's files that the pod's group (its fsGroup, POD_USER)
    reads and nobody else, the only modes libpq takes for a client key."""
    return {"name": volume, "secret": {"secretName": secret, "defaultMode": 0o440}}


def connector_secrets(job: dict[str, Any]) -> list[str]:
    """The Secrets the job's sources, sinks and lookups name by `secretRef`, mounted at SECRETS_DIR
    in every pod (the storage's is mounted apart, at STORAGE_CREDENTIALS_MOUNT)."""
    model = load_data(job, origin=f"streamjob/{job['metadata']['name']}").model
    return sorted({name for at, name in secret_refs(model) if at[0] == "model"})


def task_pod_name(task: TaskDeployment, run: int) -> str:
    """A task's pod made for a run (a recovery may keep it for later runs)."""
    return f"{task.name}-r{run}"


def task_pod(
    job: dict[str, Any],
    deployment: DeploymentPlan,
    task: TaskDeployment,
    run: int,
    settings: PodSettings,
    *,
    standby: bool = False,
    avoid: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The pod of one task made for one run: never restarted (its failure is a global recovery), kept
    by a recovery that finds it running (`node.resident`: a task process per run it serves).

    A standby pod is made for the next run while this one runs; a recovery into that run
    adopts it by its name (`node.task`). The pod prefers nodes other than those in `avoid`
    (where pods did not answer: a lost node still shows Ready until its lease runs out).
    """
    pod = _pod(
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
            LABEL_RESIDENT: "true",
            **({LABEL_STANDBY: "true"} if standby else {}),
        },
        restart="Never",
        task_id=task.task_id,
        run=run,
        standby=standby,
    )
    if avoid:
        away = {"key": "metadata.name", "operator": "NotIn", "values": sorted(avoid)}
        preferred = [{"weight": 100, "preference": {"matchFields": [away]}}]
        pod["spec"]["affinity"] = {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}
        }
    return pod


def coordinator_pod(
    job: dict[str, Any], deployment: DeploymentPlan, name: str, settings: PodSettings
) -> dict[str, Any]:
    """A coordinator candidate's pod: restarted on failure; a clean exit means the job is over."""
    return _pod(job, deployment, settings, name=name, role="coordinator", labels={}, restart="OnFailure")
