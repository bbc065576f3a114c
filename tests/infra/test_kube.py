"""The test cluster: CRD, scheduling, pods as containers of the built image, DNS, Services, RBAC,
pods of two nodes reaching each other, a node lost and started again.

Everything here runs on the session's cluster (`kube_cluster`), in a namespace of this
module's own; node-1 is lost and started again by the last test. That the cluster, once
stopped, leaves this machine as it was is checked as it stops (`tests/conftest.py`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from nopstream_operator.resources import POD_USER, connector_secret_volume

from e2e.cluster import Cluster
from e2e.netns import ns_inode
from e2e.node import E2E_IMAGE, NodeSpec
from tests.conftest import ROOT

# the session's one cluster: under pytest-xdist these tests all run on one worker
pytestmark = pytest.mark.xdist_group("kube")
NS = "infra"


@pytest.fixture(scope="module")
def cluster(kube_cluster):
    """The session's cluster, with this module's namespace as kubectl's default."""
    kube_cluster.kubectl("create", "namespace", NS)
    yield _InNamespace(kube_cluster)
    kube_cluster.kubectl("delete", "namespace", NS, "--wait=false")


class _InNamespace:
    """The cluster, with every kubectl call in this module's namespace."""

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster

    def kubectl(self, *args: str, **kw):
        return self.c.kubectl("-n", NS, *args, **kw)


def container(name: str, command: list[str], **extra) -> dict:
    return {"name": name, "image": E2E_IMAGE, "imagePullPolicy": "Never", "command": command, **extra}


def wait_for(what, check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def pod_json(cluster, name):
    out = cluster.kubectl("get", "pod", name, "-o", "json", check=False)
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
                check=False,  # a just-started API server may refuse a request for a moment
            ).stdout
            == "True"
        ),
    )
    cluster.kubectl("apply", "-f", str(ROOT / "examples" / "wordcount.yaml"))
    # no operator runs yet; the session's e2e suite installs one later: leave it nothing to run
    stored = cluster.kubectl("get", "sj", "wordcount", "-o", "json").stdout
    cluster.kubectl("delete", "sj", "wordcount")
    got = json.loads(stored)
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


def test_a_scheduled_pod_runs_as_a_container_with_its_env_and_secret(cluster):
    """Its Secret as an env variable and as the operator mounts a connector's (a client key that libpq
    takes: root's, 0440, the pod's group)."""
    cluster.kubectl("create", "secret", "generic", "creds", "--from-literal=token=s3cr3t")
    key = "/var/run/creds/token"
    script = (
        f"import os; s = os.stat('{key}'); e = os.environ; print(e['POD_NAME'], e['POD_IP'], e['TOKEN'],"
        f" os.getuid(), oct(s.st_mode & 0o777), s.st_uid, s.st_gid, open('{key}').read())"
    )
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
    ]
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"fsGroup": POD_USER},
            "containers": [
                container(
                    "main",
                    ["python", "-c", script],
                    env=env,
                    volumeMounts=[{"name": "creds", "mountPath": "/var/run/creds", "readOnly": True}],
                )
            ],
            "volumes": [connector_secret_volume("creds", "creds")],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    pod = wait_for(
        "pod Succeeded",
        lambda: (p := pod_json(cluster, "hello")) and p["status"].get("phase") == "Succeeded" and p,
    )
    node = NodeSpec(int(pod["spec"]["nodeName"].removeprefix("node-")))  # placed by the real scheduler
    ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(node.pod_subnet)
    (status,) = pod["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://")
    assert status["state"]["terminated"]["exitCode"] == 0
    # the logs come from the kubelet, through the API server (its kubelet client certificate)
    said = cluster.kubectl("logs", "hello").stdout
    assert said == f"hello {ip} s3cr3t 10001 0o440 0 10001 s3cr3t\n"  # the image's user


def running_pod(cluster, name: str, command: list[str], **spec) -> dict:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container("main", command)], **spec},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    return wait_for(
        f"{name} Running",
        lambda: (
            (p := pod_json(cluster, name))
            and p["status"].get("containerStatuses")
            and "running" in p["status"]["containerStatuses"][0]["state"]
            and p
        ),
    )


def container_pid(cluster, pod: dict) -> int:
    return cluster.c.container_pid(pod["status"]["containerStatuses"][0]["containerID"])


def test_a_deleted_pod_is_stopped_and_its_process_ends(cluster):
    pod = running_pod(cluster, "sleeper", ["sleep", "600"], terminationGracePeriodSeconds=3)
    pid = container_pid(cluster, pod)
    os.kill(pid, 0)  # running, a process of this machine
    cluster.kubectl("delete", "pod", "sleeper", "--wait=true", "--timeout=60s")
    assert pod_json(cluster, "sleeper") is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_nopstream_process_as_a_containers_first_process_stops_at_once_on_sigterm(cluster):
    # PID 1 of a container has no default signal actions: without the handler `nopstream task`
    # and `nopstream coordinator` install, this pod would take its whole 30 s grace period.
    wait = (
        "from nopstream.node.process import exit_on_sigterm; exit_on_sigterm('task');"
        " import time; time.sleep(600)"
    )
    pod = running_pod(cluster, "term", ["python", "-c", wait], terminationGracePeriodSeconds=30)
    pid = container_pid(cluster, pod)
    nspid = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("NSpid:"))
    assert nspid.split()[1:] == [str(pid), "1"]  # PID 1 of a PID namespace of its own
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "term", "--wait=true", "--timeout=60s")
    assert time.monotonic() - started < 10


def test_a_container_killed_from_outside_is_restarted_by_its_restart_policy(cluster):
    pod = running_pod(cluster, "restarter", ["sleep", "600"])
    os.kill(container_pid(cluster, pod), signal.SIGKILL)  # as the kernel's OOM killer would
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
    assert (last["exitCode"], last["reason"]) == (137, "Error")
    cluster.kubectl("delete", "pod", "restarter", "--grace-period=1", "--wait=true")


def test_a_container_over_its_memory_limit_is_oom_killed(cluster):
    hog = container(
        "main",
        ["python", "-c", "import time; b = bytearray(512 << 20); time.sleep(60)"],
        resources={"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}},
    )
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hog"},
        "spec": {"restartPolicy": "Never", "containers": [hog]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    pod = wait_for(
        "hog Failed", lambda: (p := pod_json(cluster, "hog")) and p["status"].get("phase") == "Failed" and p
    )
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)


def serve_page(cluster, name: str, page: str, **spec) -> dict:
    """A pod `name` serving `page` on port 8000, a Service `name` on port 80 for it; the pod once Ready."""
    server = [
        "sh",
        "-c",
        f"mkdir -p /tmp/w && echo '{page}' > /tmp/w/index.html && exec python -m http.server -d /tmp/w 8000",
    ]
    probe = {"httpGet": {"path": "/", "port": 8000}, "periodSeconds": 1}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {**spec, "containers": [container("main", server, readinessProbe=probe)]},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8000}]},
    }
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod, service]})
    )
    return wait_for(
        f"{name} Ready",
        lambda: (
            (p := pod_json(cluster, name))
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
            and p
        ),
    )


def test_pods_reach_a_service_by_name_and_so_does_this_machine_through_a_forward(cluster):
    page = "served by the web pod"
    serve_page(cluster, "web", page)
    # kube-proxy programs a new Service's rules a moment after its pod is Ready: a CI dry run's
    # client was refused in that moment, so the client asks again for up to 20 s
    fetch = (
        "import time, urllib.request\n"
        f"url = 'http://web.{NS}.svc.cluster.local/'\n"
        "for _ in range(40):\n"
        "    try:\n"
        "        print(urllib.request.urlopen(url, timeout=5).read().decode().strip())\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.5)\n"
        "else:\n"
        "    raise SystemExit('the Service never answered')\n"
    )
    client = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {"restartPolicy": "Never", "containers": [container("main", ["python", "-c", fetch])]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(client))
    wait_for(
        "client done",
        lambda: (p := pod_json(cluster, "client")) and p["status"].get("phase") in ("Succeeded", "Failed"),
    )
    assert (
        cluster.kubectl("logs", "client").stdout == f"{page}\n"
    )  # DNS (CoreDNS) and the Service IP (kube-proxy)
    port = cluster.c.service_port("web", 80, namespace=NS)
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode() == f"{page}\n"


def test_pods_of_two_nodes_reach_each_other_by_address_and_by_service_without_nat(cluster):
    """A server on node-1, a client on node-0: the client's requests arrive from its own pod address."""
    page = "served on node-1"
    far = serve_page(cluster, "far", page, nodeName="node-1")
    fetch = (
        "import os, time, urllib.request\n"
        "print(os.environ['POD_IP'])\n"
        f"for url in ('http://{far['status']['podIP']}:8000/', 'http://far.{NS}.svc.cluster.local/'):\n"
        "    for _ in range(40):\n"  # kube-proxy programs a new Service a moment after its pod is Ready
        "        try:\n"
        "            print(urllib.request.urlopen(url, timeout=5).read().decode().strip())\n"
        "            break\n"
        "        except OSError:\n"
        "            time.sleep(0.5)\n"
    )
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    client = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "near"},
        "spec": {
            "nodeName": "node-0",
            "restartPolicy": "Never",
            "containers": [container("main", ["python", "-c", fetch], env=env)],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(client))
    wait_for(
        "near done",
        lambda: (p := pod_json(cluster, "near")) and p["status"].get("phase") in ("Succeeded", "Failed"),
    )
    ip, *pages = cluster.kubectl("logs", "near").stdout.splitlines()
    assert pages == [page, page]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(NodeSpec(0).pod_subnet)
    served = [
        line.split()[0] for line in cluster.kubectl("logs", "far").stdout.splitlines() if '"GET /' in line
    ]
    assert served.count(ip) == 2  # both requests from the client's own address: routed, not masqueraded


def test_a_pod_gets_its_service_account_and_rbac_applies(cluster):
    cluster.kubectl("create", "serviceaccount", "reader")
    cluster.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods")
    cluster.kubectl(
        "create", "rolebinding", "reader-pods", "--role=pod-reader", f"--serviceaccount={NS}:reader"
    )
    script = (
        "import ssl, urllib.error, urllib.request\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount/'\n"
        "ctx = ssl.create_default_context(cafile=sa + 'ca.crt')\n"
        "token = open(sa + 'token').read()\n"
        "for what in ('pods', 'secrets'):\n"
        f"    url = 'https://kubernetes.default.svc/api/v1/namespaces/{NS}/' + what\n"
        "    req = urllib.request.Request(url, headers={'Authorization': 'Bearer ' + token})\n"
        "    try:\n"
        "        print(what, urllib.request.urlopen(req, context=ctx).status)\n"
        "    except urllib.error.HTTPError as e:\n"
        "        print(what, e.code)\n"
    )
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rbac"},
        "spec": {
            "serviceAccountName": "reader",
            "restartPolicy": "Never",
            "containers": [container("main", ["python", "-c", script])],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    wait_for(
        "pod done",
        lambda: (p := pod_json(cluster, "rbac")) and p["status"].get("phase") in ("Succeeded", "Failed"),
    )
    assert cluster.kubectl("logs", "rbac").stdout == "pods 200\nsecrets 403\n"


def test_a_lost_node_goes_not_ready_tainted_and_started_again_runs_its_pod_anew(cluster):
    """node-1 lost (every process of it killed at once): its container's process and its namespaces
    are gone, the controller manager calls it NotReady within its grace and taints it unreachable;
    started again it is Ready and runs its pod anew. (That the stopped cluster leaves this machine
    as it was is checked as the session's cluster stops: `kube_cluster`.)"""
    own = cluster.c
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "lost"},
        "spec": {"nodeName": "node-1", "containers": [container("main", ["sleep", "600"])]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    running = wait_for(
        "lost Running",
        lambda: (p := pod_json(cluster, "lost")) and p["status"].get("phase") == "Running" and p,
    )
    holder = own.node("node-1").ns.holder.pid
    assert ns_inode(holder, "net") != ns_inode(own.ns.holder.pid, "net")  # a namespace of its own
    net = ns_inode(own.ns.holder.pid, "net")
    members = own.ns.members()
    assert members and all(ns_inode(p, "net") == net or ns_inode(p, "mnt") for p in members)
    sleeper = container_pid(cluster, running)

    lost = time.monotonic()
    own.kill_node("node-1")
    assert _dead(sleeper) and _dead(holder)
    wait_for("node-1 NotReady", lambda: not own.node_ready("node-1"), timeout=60)
    assert time.monotonic() - lost < 30  # four lease renewals missed: 12 s, not the default 50 s
    taints = json.loads(own.kubectl("get", "node", "node-1", "-o", "jsonpath={.spec.taints}").stdout)
    assert {(t["key"], t["effect"]) for t in taints} == {
        ("node.kubernetes.io/unreachable", "NoSchedule"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
    }
    assert own.node_ready("node-0")

    own.restart_node("node-1")
    wait_for(
        "lost running again on the restarted node",
        lambda: (
            (p := pod_json(cluster, "lost"))["status"].get("containerStatuses", [{}])[0].get("restartCount")
            == 1
            and "running" in p["status"]["containerStatuses"][0]["state"]
        ),
    )
    wait_for(
        "node-1 untainted",
        lambda: not own.kubectl("get", "node", "node-1", "-o", "jsonpath={.spec.taints}").stdout,
    )
    cluster.kubectl("delete", "pod", "lost", "--wait=true", "--timeout=60s")


def _dead(pid: int) -> bool:
    """Whether process `pid` has exited: gone, or a zombie its new parent has not reaped yet
    (killing a shim makes its container an orphan; a CI container's PID 1 may reap late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
