"""A real Kubernetes control plane with the process node agent: CRD, scheduling, pods, RBAC."""

from __future__ import annotations

import json
import os
import time

import pytest

from e2e.cluster import Cluster
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A control plane and one agent node, for this module."""
    with Cluster.start(tmp_path_factory.mktemp("kube")) as c:
        c.start_agent("agent-0")
        yield c


def wait_for(what, check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def pod_json(cluster, name, ns="default"):
    out = cluster.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def test_crd_is_accepted_and_a_streamjob_round_trips(cluster):
    applied = cluster.kubectl("apply", "-f", str(ROOT / "crds" / "streamjob.yaml"))
    assert "customresourcedefinition.apiextensions.k8s.io/streamjobs.nopstream.io" in applied.stdout
    wait_for(
        "CRD established",
        lambda: (
            cluster.kubectl(
                "get",
                "crd",
                "streamjobs.nopstream.io",
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Established')].status}",
            ).stdout
            == "True"
        ),
    )
    cluster.kubectl("apply", "-f", str(ROOT / "examples" / "wordcount.yaml"))
    got = json.loads(cluster.kubectl("get", "sj", "wordcount", "-o", "json").stdout)
    assert got["spec"]["model"]["operators"][2] == {
        "id": "count",
        "type": "aggregate",
        "inputs": ["by-word"],
        "aggregate": "count",
        "emit": "final",
        "stateVersion": 1,
    }
    assert got["spec"]["semanticMode"] == "STRICT_EXACTLY_ONCE"
    bad = cluster.kubectl(
        "apply",
        "-f",
        "-",
        check=False,
        input=(
            "apiVersion: nopstream.io/v1alpha1\nkind: StreamJob\nmetadata: {name: bad}\n"
            "spec: {semanticMode: SOMETIMES, model: {sources: [], sinks: []}}\n"
        ),
    )
    assert bad.returncode != 0
    assert 'spec.semanticMode: Unsupported value: "SOMETIMES"' in bad.stderr


def test_scheduled_pod_runs_to_succeeded(cluster, tmp_path):
    out = tmp_path / "out.txt"
    cluster.kubectl("create", "secret", "generic", "creds", "--from-literal=token=s3cr3t")
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello", "labels": {"app": "hello"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "ignored",
                    "command": ["python", "-c"],
                    "args": [
                        "import os; open(os.environ['OUT'], 'w').write("
                        "os.environ['POD_NAME'] + ' ' + os.environ['POD_IP'] + ' ' + os.environ['TOKEN'])"
                    ],
                    "env": [
                        {"name": "OUT", "value": str(out)},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                    ],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    pod = wait_for(
        "pod Succeeded",
        lambda: (p := pod_json(cluster, "hello")) and p["status"].get("phase") == "Succeeded" and p,
    )
    assert pod["spec"]["nodeName"] == "agent-0"  # placed by the real scheduler
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.0.0.") and ip != "127.0.0.1"
    assert out.read_text() == f"hello {ip} s3cr3t"
    (status,) = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 0


def test_deleted_pod_is_stopped(cluster):
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sleeper"},
        "spec": {
            "terminationGracePeriodSeconds": 3,
            "containers": [{"name": "main", "image": "ignored", "command": ["sleep", "600"]}],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    pod = wait_for(
        "pod Running",
        lambda: (
            (p := pod_json(cluster, "sleeper"))
            and p["status"].get("phase") == "Running"
            and p["status"].get("containerStatuses")
            and p
        ),
    )
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("agent://"))
    os.kill(pid, 0)  # running
    cluster.kubectl("delete", "pod", "sleeper", "--wait=true", "--timeout=60s")
    assert pod_json(cluster, "sleeper") is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_kill_annotation_and_restart_policy(cluster):
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "restarter"},
        "spec": {"containers": [{"name": "main", "image": "ignored", "command": ["sleep", "600"]}]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    wait_for(
        "running",
        lambda: (
            (p := pod_json(cluster, "restarter"))
            and p["status"].get("containerStatuses")
            and "running" in p["status"]["containerStatuses"][0]["state"]
        ),
    )
    cluster.kubectl("annotate", "pod", "restarter", "e2e.nopstream.io/kill=KILL:1")
    pod = wait_for(
        "restarted",
        lambda: (
            (p := pod_json(cluster, "restarter"))
            and p["status"]["containerStatuses"][0]["restartCount"] == 1
            and "running" in p["status"]["containerStatuses"][0]["state"]
            and p
        ),
    )
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == -9
    cluster.kubectl("delete", "pod", "restarter", "--grace-period=1", "--wait=true")


def test_pod_gets_its_service_account_and_rbac_applies(cluster):
    cluster.kubectl("create", "serviceaccount", "reader")
    cluster.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods")
    cluster.kubectl(
        "create", "rolebinding", "reader-pods", "--role=pod-reader", "--serviceaccount=default:reader"
    )
    script = (
        "import subprocess, sys\n"
        "ok = subprocess.run(['kubectl', 'get', 'pods'], capture_output=True).returncode\n"
        "denied = subprocess.run(['kubectl', 'get', 'secrets'], capture_output=True)\n"
        "print(ok, denied.returncode, denied.stderr.decode().strip().splitlines()[-1])\n"
    )
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rbac"},
        "spec": {
            "serviceAccountName": "reader",
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "ignored",
                    "command": ["python", "-c", script],
                    "env": [{"name": "PATH", "value": f"{os.path.dirname(kubectl_path())}:$(PATH)"}],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    wait_for(
        "pod done",
        lambda: (p := pod_json(cluster, "rbac")) and p["status"].get("phase") in ("Succeeded", "Failed"),
    )
    logs = cluster.workdir / "agent" / "agent-0" / "pods"
    (log_file,) = [d / "main.log" for d in logs.iterdir() if d.name.startswith("default_rbac_")]
    assert log_file.read_text().strip() == (
        '0 1 Error from server (Forbidden): secrets is forbidden: User "system:serviceaccount:default:reader"'
        ' cannot list resource "secrets" in API group "" in the namespace "default"'
    )


def kubectl_path():
    from e2e import servers

    return servers.binary("kubectl")
