"""The objects the operator creates, built from plans: exact, and owned by the StreamJob."""

from __future__ import annotations

import json

import yaml
from nopstream_operator.acts import with_condition
from nopstream_operator.resources import (
    PodSettings,
    coordinator_pod,
    job_secret,
    network_policy,
    plan_configmap,
    task_pod,
)

from nopstream.model.load import load_data
from nopstream.node.wire import authority
from nopstream.plan import compiler
from tests.conftest import EXAMPLES

JOB = {**yaml.safe_load((EXAMPLES / "wordcount.yaml").read_text())}
JOB["metadata"] = {**JOB["metadata"], "namespace": "prod", "uid": "u-1"}
JOB["spec"]["checkpoint"]["storage"] = {"s3": {"endpoint": "http://s3:9000", "bucket": "checkpoints"}}
SETTINGS = PodSettings(etcd="etcd:2379", command=("nopstream",), extra_env={"A": "1"}, lease_ttl=7)


def plans():
    return compiler.compile_model(load_data(JOB), backend="kubernetes", namespace="prod")


def test_a_task_pod_has_its_identity_run_plan_and_probes():
    p = plans()
    task = p.deployment.tasks[1]
    pod = task_pod(JOB, p.deployment, task, 4, SETTINGS)
    assert pod["metadata"]["name"] == "wordcount-lines-1-r4"
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/name": "nopstream",
        "app.kubernetes.io/managed-by": "nopstream-operator",
        "nopstream.io/job": "wordcount",
        "nopstream.io/role": "task",
        "nopstream.io/run": "4",
        "nopstream.io/vertex": "lines",
        "nopstream.io/subtask": "1",
        "nopstream.io/task": "wordcount-lines-1",
        "nopstream.io/resident": "true",
    }
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "nopstream.io/v1alpha1",
            "kind": "StreamJob",
            "name": "wordcount",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    (c,) = spec["containers"]
    assert c["command"] == ["nopstream", "task"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env == {
        "NOPSTREAM_PLAN_DIR": "/etc/nopstream/plan",
        "NOPSTREAM_ETCD": "etcd:2379",
        "NOPSTREAM_ATTEMPT": {"fieldRef": {"fieldPath": "metadata.name"}},
        "NOPSTREAM_HOST": {"fieldRef": {"fieldPath": "status.podIP"}},
        "NOPSTREAM_ADVERTISE": {"fieldRef": {"fieldPath": "status.podIP"}},
        "NOPSTREAM_PORT": "7700",
        "NOPSTREAM_HEALTH_PORT": "7701",
        "NOPSTREAM_LEASE_TTL": "7",
        "NOPSTREAM_TASK_ID": "wordcount/main/lines/1",
        "NOPSTREAM_RUN": "4",
        "NOPSTREAM_RESIDENT": "true",
        "NOPSTREAM_SECRET_FILE": "/var/run/nopstream/job-secret/secret",
        "NOPSTREAM_TLS": "true",
        "A": "1",
    }
    assert c["readinessProbe"]["tcpSocket"] == {"port": 7700}
    # liveness asks the process's liveness thread: a stopped process fails it (a TCP probe would pass)
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 7701}
    # liveness only once the process first listened: a slow start is not killed
    assert c["startupProbe"] == {"tcpSocket": {"port": 7700}, "periodSeconds": 1, "failureThreshold": 120}
    fp = p.deployment.partitioned_fingerprint
    assert spec["volumes"] == [
        {"name": "plan", "configMap": {"name": f"wordcount-plan-{fp[7:17]}"}},
        {"name": "job-secret", "secret": {"secretName": "wordcount-secret"}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    assert c["volumeMounts"] == [
        {"name": "scratch", "mountPath": "/tmp"},
        {"name": "plan", "mountPath": "/etc/nopstream/plan", "readOnly": True},
        {"name": "job-secret", "mountPath": "/var/run/nopstream/job-secret", "readOnly": True},
    ]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }


def test_the_etcd_access_secret_reaches_every_pod_as_files_named_in_its_environment():
    p = plans()
    settings = PodSettings(etcd="etcd:2379", etcd_access_secret="etcd-client")
    for pod in (
        task_pod(JOB, p.deployment, p.deployment.tasks[0], 1, settings),
        coordinator_pod(JOB, p.deployment, "c-0", settings),
    ):
        (c,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["NOPSTREAM_ETCD_ACCESS"] == "/var/run/nopstream/etcd-access"
        assert {"name": "etcd-access", "secret": {"secretName": "etcd-client"}} in pod["spec"]["volumes"]
        mount = {"name": "etcd-access", "mountPath": "/var/run/nopstream/etcd-access", "readOnly": True}
        assert mount in c["volumeMounts"]
    plain = task_pod(JOB, p.deployment, p.deployment.tasks[0], 1, SETTINGS)
    assert "etcd-access" not in str(plain)


def test_storage_credentials_reach_pods_as_files_and_the_job_secret_is_owned_by_the_job():
    job = {**JOB, "spec": {**JOB["spec"], "checkpoint": {**JOB["spec"]["checkpoint"]}}}
    job["spec"]["checkpoint"]["storage"] = {
        "s3": {"endpoint": "http://s3:9000", "bucket": "checkpoints", "secretRef": "s3-cred"}
    }
    p = compiler.compile_model(load_data(job), backend="kubernetes", namespace="prod")
    pod = coordinator_pod(job, p.deployment, "c-0", SETTINGS)
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["NOPSTREAM_S3_CREDENTIALS"] == "/var/run/nopstream/storage"
    assert not any("S3_ACCESS" in name or "S3_SECRET" in name for name in env)
    assert {"name": "storage-credentials", "secret": {"secretName": "s3-cred"}} in pod["spec"]["volumes"]
    assert {"name": "storage-credentials", "mountPath": "/var/run/nopstream/storage", "readOnly": True} in c[
        "volumeMounts"
    ]
    certificate = authority.issue("wordcount")
    secret = job_secret(job, p.deployment, "s" * 64, certificate)
    assert secret["metadata"]["name"] == "wordcount-secret"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert (secret["immutable"], secret["stringData"]) == (
        True,
        {"secret": "s" * 64, "ca.crt": certificate.ca.decode(), "tls.crt": certificate.cert.decode()}
        | {"tls.key": certificate.key.decode()},
    )


def test_a_jobs_pods_accept_only_its_own_pods_the_operator_and_named_peers():
    p = plans()
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    settings = PodSettings(etcd="etcd:2379", operator_namespace="nopstream-system", ingress_from=(scraper,))
    policy = network_policy(JOB, p.deployment, settings)
    assert policy["metadata"]["name"] == "wordcount-peers"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert policy["spec"] == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "nopstream",
                "app.kubernetes.io/managed-by": "nopstream-operator",
                "nopstream.io/job": "wordcount",
            }
        },
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [
                    {"podSelector": {"matchLabels": {"nopstream.io/job": "wordcount"}}},
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "nopstream-system"}
                        },
                        "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
                    },
                    scraper,
                ],
                "ports": [{"protocol": "TCP", "port": 7700}],
            }
        ],
    }


def test_the_plan_configmap_round_trips_both_plans_and_coordinators_restart_on_failure():
    p = plans()
    cm = plan_configmap(JOB, p.partitioned, p.deployment)
    assert cm["immutable"] is True
    assert cm["metadata"]["annotations"] == {
        "nopstream.io/plan-fingerprint": p.deployment.partitioned_fingerprint
    }
    assert compiler.load_document(cm["data"]["partitioned.json"]) == p.partitioned
    assert compiler.load_document(cm["data"]["deployment.json"]) == p.deployment
    pod = coordinator_pod(JOB, p.deployment, "wordcount-coordinator-1", SETTINGS)
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    assert pod["spec"]["containers"][0]["command"] == ["nopstream", "coordinator"]
    assert "NOPSTREAM_TASK_ID" not in json.dumps(pod)


def test_a_condition_keeps_its_transition_time_while_its_status_holds():
    first = with_condition([], "Ready", "True", "AllTasksReady", "3/3")
    again = with_condition(first, "Ready", "True", "AllTasksReady", "3/3 tasks")
    assert again[0].last_transition_time == first[0].last_transition_time
    assert again[0].message == "3/3 tasks"


def test_operator_replicas_get_distinct_stable_peering_priorities():
    from nopstream_operator.handlers import peering_priority

    names = [f"nopstream-operator-7fd9866774-{s}" for s in ("kdtnx", "vlf6b", "22xxw", "a1b2c")]
    priorities = [peering_priority(n) for n in names]
    assert len(set(priorities)) == len(names) and all(0 < p <= 1_000_000 for p in priorities)
    assert peering_priority(names[0]) == priorities[0]


def test_the_secrets_that_connectors_and_lookups_name_are_mounted_read_only_in_every_pod():
    """Root's files the pod's group reads and nobody else (0440, fsGroup): libpq refuses a client key
    that others may read."""
    job = {**JOB, "spec": {**JOB["spec"], "model": {**JOB["spec"]["model"]}}}
    lookup = {"kind": "postgres", "database": "d", "user": "u", "query": "SELECT 1", "into": "r"}
    lookup["secretRef"] = "lookup-cred"
    job["spec"]["model"]["operators"] = [
        *JOB["spec"]["model"]["operators"],
        {
            "id": "tier",
            "type": "lookup",
            "inputs": ["count"],
            "lookup": {**lookup, "secretRef": "lookup-cred"},
        },
    ]
    job["spec"]["model"]["sinks"] = [
        {
            "id": "db",
            "type": "postgres",
            "inputs": ["tier"],
            "config": {"database": "d", "user": "u", "table": "t", "columns": ["c"], "secretRef": "pg-cred"},
        }
    ]
    p = compiler.compile_model(load_data(job), backend="kubernetes", namespace="prod")
    for pod in (
        task_pod(job, p.deployment, p.deployment.tasks[0], 1, SETTINGS),
        coordinator_pod(job, p.deployment, "c-0", SETTINGS),
    ):
        spec = pod["spec"]
        assert spec["volumes"][-2:] == [
            {"name": "secret-0", "secret": {"secretName": "lookup-cred", "defaultMode": 0o440}},
            {"name": "secret-1", "secret": {"secretName": "pg-cred", "defaultMode": 0o440}},
        ]
        assert spec["securityContext"]["fsGroup"] == 10001
        mounts = spec["containers"][0]["volumeMounts"]
        assert mounts[-2:] == [
            {"name": "secret-0", "mountPath": "/var/run/secrets/nopstream/lookup-cred", "readOnly": True},
            {"name": "secret-1", "mountPath": "/var/run/secrets/nopstream/pg-cred", "readOnly": True},
        ]
