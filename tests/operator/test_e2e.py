"""End to end on a Kubernetes cluster: helm install, StreamJobs, kills, rescale, refusals, quiet passes.

By default the suite brings its own world: the session's two-node cluster of `e2e/`
(containerd and a kubelet per node, in network namespaces of the suite's own), pods that are
containers of the runtime image built by scripts/build-image.sh, and the chart
installed as users install it, with its bundled etcd and MinIO as pods reached by
Service name; this process reaches them through loopback forwards into the
namespace. Given NOPSTREAM_E2E_KUBECONFIG it runs, unchanged, against that cluster
instead; then it also needs
  NOPSTREAM_E2E_ETCD              etcd host:port, reachable from here and from the pods
  NOPSTREAM_E2E_S3                S3 URL, reachable from here and from the pods
  NOPSTREAM_E2E_S3_ACCESS_KEY, NOPSTREAM_E2E_S3_SECRET_KEY
  NOPSTREAM_E2E_IMAGE             (optional) the jobs' image, holding tests/operator/e2efns.py
                                  (default nopstream/runtime-e2e:0.1.0, docs/operator.md)
  NOPSTREAM_E2E_VALUES            (optional) a Helm values file, e.g. the operator's image
and kills pods by deleting them (there is no node of ours to kill their processes on)
and checks quiet passes by resource versions (there is no audit log to read).
The job: a word count at parallelism 3 from S3 to S3, strict exactly-once; its output
is compared, as an exact multiset, with the output of the same model run on the
embedded default (`nopstream run`) without faults.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import io
import json
import os
import random
import secrets
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from e2e import servers
from e2e.certs import Pki
from e2e.cluster import Cluster
from e2e.node import CLUSTER_DOMAIN, E2E_IMAGE, NODE_IP, NODE_NAME, NODES
from nopstream.local import kills
from tests.conftest import EXAMPLES, ROOT, s3_records
from tests.operator import e2efns, nemesis

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from minio import Minio

    from nopstream.cluster.etcd import EtcdBackend

# the session's one cluster: under pytest-xdist these tests all run on one worker
pytestmark = pytest.mark.xdist_group("kube")
FNS_DIR = Path(__file__).resolve().parent  # e2efns.py: the jobs' user functions
OPERATOR_USER = "system:serviceaccount:default:nopstream-operator"
BUNDLED_S3 = "https://nopstream-minio:9000"  # the chart's MinIO, by Service name, as pods reach it
# the jobs' image: the runtime with tests/operator/e2efns.py (runtime-image/Dockerfile.e2e)
JOB_IMAGE = os.environ.get("NOPSTREAM_E2E_IMAGE", E2E_IMAGE.removeprefix("docker.io/"))


@dataclass
class World:
    """Where the suite runs and the helpers its tests share."""

    kubeconfig: Path
    etcd: str  # host:port, from this process
    s3_url: str  # from this process
    pod_s3_url: str  # from the pods
    access_key: str
    secret_key: str
    workdir: Path
    values: list[Path] = field(default_factory=list)
    cluster: Cluster | None = None  # our own: kills of a container's process, the audit log
    pki: Pki | None = None  # the CA of the servers' certificates (None: they speak plain text)
    etcd_access: Path | None = None  # this process's etcd credentials (`NOPSTREAM_ETCD_ACCESS`)

    @property
    def ca(self) -> Path | None:
        """What the servers' certificates are checked against."""
        return self.pki.ca.cert if self.pki is not None else None

    def etcd_backend(self) -> EtcdBackend:
        """A client of the jobs' etcd, as this process reaches it."""
        from nopstream.cluster.etcd import EtcdBackend
        from nopstream.cluster.etcd_access import read_access

        host, _, port = self.etcd.rpartition(":")
        access = read_access(self.etcd_access) if self.etcd_access is not None else None
        return EtcdBackend(host, int(port), access=access)

    def s3_client(self) -> Minio:
        """A client of the jobs' S3, as this process reaches it."""
        import urllib3
        from minio import Minio

        http = (
            None if self.ca is None else urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(self.ca))
        )
        secure = self.s3_url.startswith("https://")
        return Minio(
            self.s3_url.split("://", 1)[1], self.access_key, self.secret_key, secure=secure, http_client=http
        )

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return subprocess.run(
            [servers.binary("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True, text=True, check=check, input=input, timeout=60,
        ).stdout  # fmt: skip

    @functools.cached_property
    def _api(self) -> tuple[ApiClient, str]:
        """(a client of the API server, the namespace) as kubectl reaches them with this kubeconfig: the
        reads of the wait loops start no kubectl each (60 ms of CPU apiece, some 1,200 in a CI run)."""
        from kubernetes import config

        _, active = config.list_kube_config_contexts(config_file=str(self.kubeconfig))
        return config.new_client_from_config(config_file=str(self.kubeconfig)), active["context"].get(
            "namespace", "default"
        )

    def job(self, name: str) -> dict:
        from kubernetes import client

        api, namespace = self._api
        found: dict = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "nopstream.io", "v1alpha1", namespace, "streamjobs", name
        )
        return found

    def wait(self, what: str, check, timeout: float = 120.0, job: str | None = None):
        """`check()` once true; an AssertionError with the cluster's account after `timeout`, or as
        soon as `job` (a StreamJob's name) has failed."""
        deadline, failed = time.monotonic() + timeout, None
        while time.monotonic() < deadline and failed is None:
            began = time.monotonic()
            value = check()
            if value:
                return value
            if job is not None and (status := self.job(job).get("status", {})).get("phase") == "Failed":
                failed = status
            # a look through the API client takes milliseconds; one that starts kubectl (60 ms of CPU)
            # waits four times its length: the looks never take more than a fifth of this machine
            time.sleep(max(0.25, 4 * (time.monotonic() - began)))
        events = self.kubectl("get", "events", "--sort-by=.lastTimestamp", check=False).splitlines()[-25:]
        raise AssertionError(
            (f"{job} failed: {json.dumps(failed)}" if failed else f"timed out waiting for {what}")
            + "; events:\n"
            + "\n".join(events)
            + f"\noperator log:\n{self.operator_log()}"
            + f"\nunfinished job pods:\n{self.unfinished_pods_logs()}"
        )

    def operator_log(self) -> str:
        return self.kubectl("logs", "-l", "app.kubernetes.io/component=operator", "--tail=60", check=False)

    def unfinished_pods_logs(self) -> str:
        """Each job pod not Succeeded: its phase and the end of its log (without access lines), which
        on our nodes ends with where its process waits (`nopstream.stacks`, by SIGUSR1)."""
        found = self.kubectl("get", "pods", "-l", "nopstream.io/job", "-o", "json", check=False)
        pods = [
            p
            for p in json.loads(found or '{"items": []}')["items"]
            if p["status"].get("phase") != "Succeeded"
        ]
        if self.cluster is not None:
            for pod in pods:
                for container in pod["status"].get("containerStatuses", []):
                    if "running" in container.get("state", {}):
                        with contextlib.suppress(Exception):  # it may end meanwhile: the log says so
                            pid = self.cluster.container_pid(container["containerID"])
                            for each in (pid, *kills.children(pid)):  # a task pod's task process too
                                os.kill(each, signal.SIGUSR1)
            time.sleep(1)
        out = []
        for pod in pods:
            name = pod["metadata"]["name"]
            log = self.kubectl("logs", name, "--tail=200", check=False).splitlines()
            lines = [line for line in log if "aiohttp.access" not in line][-24:]
            out.append(f"-- {name} ({pod['status'].get('phase')})\n" + "\n".join(lines))
        return "\n".join(out)

    def pods(self, job: str) -> list[dict]:
        from kubernetes import client

        api, namespace = self._api
        listed = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=f"nopstream.io/job={job}", _preload_content=False
        )
        items: list[dict] = json.loads(listed.data)["items"]
        return items

    def container_pid(self, pod: str, timeout: float = 15.0) -> int:
        """The host PID of the pod's container on our nodes. The pod's status may still name a
        container that just ended (a CI run's pause and a kill found none): the pod is read again
        until a node runs the container it names."""
        assert self.cluster is not None
        deadline = time.monotonic() + timeout
        while True:
            status = json.loads(self.kubectl("get", "pod", pod, "-o", "json"))["status"]
            with contextlib.suppress(LookupError, KeyError, IndexError):
                return self.cluster.container_pid(status["containerStatuses"][0]["containerID"])
            if time.monotonic() > deadline:
                raise LookupError(f"no node runs the container of pod {pod} ({status.get('phase')})")
            time.sleep(0.5)

    def kill(self, pod: str, nonce: int) -> None:
        """Kill a pod: on our nodes, odd nonces SIGKILL its container's process from outside (as
        the OOM killer would) and even ones force-delete it; on any cluster, force-delete it."""
        if self.cluster is not None and nonce % 2:
            os.kill(self.container_pid(pod), signal.SIGKILL)
        else:
            self.kubectl("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")

    def audit(self) -> list[dict[str, Any]] | None:
        """Our own API server's audited writes, or None on a cluster of somebody else's."""
        return self.cluster.audit_writes() if self.cluster is not None else None


@pytest.fixture(scope="module")
def world(tmp_path_factory, request) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("e2e")
    given = os.environ.get("NOPSTREAM_E2E_KUBECONFIG")
    if given:
        s3 = os.environ["NOPSTREAM_E2E_S3"]
        w = World(
            Path(given),
            os.environ["NOPSTREAM_E2E_ETCD"],
            s3,
            s3,
            os.environ["NOPSTREAM_E2E_S3_ACCESS_KEY"],
            os.environ["NOPSTREAM_E2E_S3_SECRET_KEY"],
            workdir,
            [Path(v) for v in [os.environ.get("NOPSTREAM_E2E_VALUES")] if v],
        )
        install_chart(w)
        yield w
        return
    w = own_world(request.getfixturevalue("kube_cluster"), workdir)
    yield w
    subprocess.run(
        [servers.binary("helm"), "uninstall", "nopstream", "-n", "default", "--wait"],
        capture_output=True, env=helm_env(w), timeout=120, check=False,
    )  # fmt: skip


def own_world(cluster: Cluster, workdir: Path) -> World:
    """The chart installed on our cluster, its bundled etcd and MinIO serving TLS only (etcd with
    client certificates and authentication on), and forwards to both."""
    repository, _, tag = E2E_IMAGE.removeprefix("docker.io/").rpartition(":")
    # the servers and the operator stay on node-0, beside the control plane: a lost worker node
    # takes job pods only (a lost etcd or MinIO is another fault, not a node loss of the job's)
    beside_control_plane = {"nodeSelector": {"kubernetes.io/hostname": NODE_NAME}}
    pki = Pki(workdir / "servers-pki")
    access = server_secrets(cluster, pki)
    ours = {
        "image": {"repository": repository, "tag": tag},
        "operator": beside_control_plane,
        "etcd": {
            "bundled": True,
            "image": "nopstream-e2e/etcd:0.1.0",
            "tlsSecret": "e2e-etcd-tls",
            "accessSecret": "e2e-etcd-access",
            **beside_control_plane,
        },
        "minio": {
            "bundled": True,
            "image": "nopstream-e2e/minio:0.1.0",
            "tlsSecret": "e2e-minio-tls",
            **beside_control_plane,
        },
        "storageSecret": {"ca": pki.ca.cert.read_text()},
        # the suite reaches Services through forwards in node-0's namespace: from the nodes'
        # addresses, as an administrator's tools would from a bastion (kube-router enforces this)
        "networkPolicy": {"from": [{"ipBlock": {"cidr": str(NODES)}}]},
    }
    (workdir / "node-values.yaml").write_text(yaml.safe_dump(ours))
    w = World(
        cluster.kubeconfig, "", "", BUNDLED_S3, "e2e-access", "e2e-secret-key", workdir,
        [workdir / "node-values.yaml"], cluster=cluster, pki=pki, etcd_access=access,
    )  # fmt: skip
    install_chart(w)
    w.etcd = f"127.0.0.1:{cluster.service_port('nopstream-etcd', 2379)}"
    w.s3_url = f"https://127.0.0.1:{cluster.service_port('nopstream-minio', 9000)}"
    servers.enable_etcd_auth(f"https://{w.etcd}", pki, secrets.token_hex(8))
    # a Ready pod may not be behind its Service's address yet: a CI run's first bucket met a closed
    # connection (the forward found nothing there)
    ca = ssl.create_default_context(cafile=str(pki.ca.cert))
    ready = f"{w.s3_url}/minio/health/ready"
    servers.wait_until("the bundled MinIO through its Service", lambda: servers.http_ok(ready, context=ca))
    return w


def server_secrets(cluster: Cluster, pki: Pki) -> Path:
    """The bundled etcd's and MinIO's serving certificates and the jobs' etcd credentials (a
    certificate of SECURE_ETCD_USER) as Secrets of the chart's namespace; a directory of the
    same credentials for this process."""
    names = ("localhost", "{}", "{}.default", "{}.default.svc", f"{{}}.default.svc.{CLUSTER_DOMAIN}")
    for server, secret in (("nopstream-etcd", "e2e-etcd-tls"), ("nopstream-minio", "e2e-minio-tls")):
        pair = pki.issue(
            server, server, server_names=tuple(n.format(server) for n in names), server_ips=("127.0.0.1",)
        )
        files = {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": pki.ca.cert}
        cluster.kubectl(
            "create", "secret", "generic", secret, *(f"--from-file={k}={v}" for k, v in files.items())
        )
    access = pki.etcd_access(pki.dir / "etcd-access", servers.SECURE_ETCD_USER)
    cluster.kubectl("create", "secret", "generic", "e2e-etcd-access", f"--from-file={access}")
    return access


@dataclass(frozen=True)
class Broker:
    """A Kafka broker for the jobs: its bootstrap for this process and for the pods."""

    here: str
    pods: str


@pytest.fixture(scope="module")
def broker(world, tmp_path_factory) -> Iterator[Broker]:
    """On our cluster, a broker inside the cluster's namespace: pods reach it at node-0's
    address, this process through a forward (its second listener advertises the forward)."""
    if world.cluster is None:
        given = os.environ.get("NOPSTREAM_E2E_KAFKA")
        if not given:
            pytest.skip("NOPSTREAM_E2E_KAFKA (host:port reachable from here and the pods) is not set")
        yield Broker(given, given)
        return
    port = world.cluster.forward(NODE_IP, 9093)
    listeners = servers.KafkaListeners(
        client=(NODE_IP, 9093),
        advertised=("127.0.0.1", port),
        controller=("127.0.0.1", 9094),
        pods=(NODE_IP, 9092),
    )
    kafka = servers.start_kafka(
        tmp_path_factory.mktemp("broker"), listeners=listeners, wrap=world.cluster.ns.wrap
    )
    yield Broker(kafka.bootstrap, f"{NODE_IP}:9092")
    kafka.stop()


@pytest.fixture
def kafka(broker, request):
    """Topics on the jobs' broker (this module's, not the session's loopback one)."""
    from tests.kafka_util import Topics

    return Topics(broker.here, request.node.name)


@pytest.fixture
def s3_client(world):
    return world.s3_client()


@pytest.fixture
def bucket(s3_client, request):
    import secrets

    name = f"e2e-{request.node.name[5:25].replace('_', '-')}-{secrets.token_hex(3)}".lower()
    s3_client.make_bucket(name)
    return name


def helm_env(w: World) -> dict[str, str]:
    return {
        **os.environ,
        "KUBECONFIG": str(w.kubeconfig),
        "HELM_CACHE_HOME": str(w.workdir / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(w.workdir / "helm" / "config"),
        "HELM_DATA_HOME": str(w.workdir / "helm" / "data"),
    }


def install_chart(w: World) -> None:
    """`helm install` the chart: two operator replicas, the world's etcd and S3 credentials."""
    values: dict[str, Any] = {
        "operator": {"replicas": 2},  # kopf peering: one replica acts, the other waits
        "pods": {"leaseTtlSeconds": 6},  # 4 s lost a starting task's lease on two loaded cores
        "storageSecret": {"create": True, "accessKey": w.access_key, "secretKey": w.secret_key},
    }
    if w.etcd:
        values["etcd"] = {"endpoint": w.etcd}
    (w.workdir / "values.yaml").write_text(yaml.safe_dump(values))
    files = [arg for v in [w.workdir / "values.yaml", *w.values] for arg in ("-f", str(v))]
    chart = str(ROOT / "charts" / "nopstream")
    install = [servers.binary("helm"), "install", "nopstream", chart, "-n", "default", *files]
    done = subprocess.run(
        [*install, "--wait", "--timeout", "180s"],
        capture_output=True,
        text=True,
        env=helm_env(w),
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    w.wait(
        "both operator pods running",
        lambda: w.kubectl(
            "get", "pods", "-l", "app.kubernetes.io/component=operator",
            "-o", "jsonpath={.items[*].status.phase}", check=False,
        ) == "Running Running",
    )  # fmt: skip


def wordcount(
    name: str,
    bucket: str,
    minio_url: str,
    out: str,
    *,
    key_fn: str = "e2efns:word",
    parallelism: int = 3,
    standby: bool = False,
) -> dict:
    return {
        "apiVersion": "nopstream.io/v1alpha1",
        "kind": "StreamJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "image": JOB_IMAGE,
            "semanticMode": "STRICT_EXACTLY_ONCE",
            "parallelism": parallelism,
            "standbyTasks": standby,
            "checkpoint": {
                "intervalMs": 500,
                "storage": {
                    "s3": {
                        "endpoint": minio_url,
                        "bucket": bucket,
                        "prefix": f"cp-{out}",
                        "secretRef": "nopstream-storage",
                    }
                },
            },
            "model": {
                "sources": [
                    {
                        "id": "lines",
                        "type": "s3",
                        "config": {"endpoint": minio_url, "bucket": bucket, "prefix": "in/"},
                    }
                ],
                "operators": [
                    {"id": "split", "type": "flat_map", "fn": "e2efns:split"},
                    {"id": "by-word", "type": "key_by", "key": {"fn": key_fn}},
                    {"id": "count", "type": "aggregate", "aggregate": "count"},
                ],
                "sinks": [
                    {
                        "id": "out",
                        "type": "s3",
                        "config": {"endpoint": minio_url, "bucket": bucket, "prefix": f"{out}/"},
                    }
                ],
            },
        },
    }


def upload_lines(client, bucket: str, rng: random.Random, *, files: int, lines: int, words: int) -> None:
    """Objects in/part-N.txt of random lines of words from a 300-word vocabulary."""
    vocabulary = [f"w{i}" for i in range(300)]
    for f in range(files):
        data = "".join(" ".join(rng.choices(vocabulary, k=words)) + "\n" for _ in range(lines)).encode()
        client.put_object(bucket, f"in/part-{f}.txt", io.BytesIO(data), len(data))


def release(client, bucket: str) -> None:
    """End the pacing of the jobs reading `bucket` (`e2efns.RELEASE`): their faults are done, so the
    rest of their input runs at full speed (within a second or two: each task process looks once a
    second)."""
    client.put_object(bucket, e2efns.RELEASE, io.BytesIO(b""), 0)


@dataclass
class CleanRun:
    """`nopstream run` of a model on the embedded default (no cluster, no faults), in the background:
    it runs while the cluster runs the same job, and `output()` waits for it."""

    process: subprocess.Popen[bytes]
    err: Path
    client: Any
    bucket: str
    prefix: str

    @classmethod
    def start(cls, w: World, client, bucket: str, model: dict) -> CleanRun:
        name = model["metadata"]["name"]
        (w.workdir / f"{name}.yaml").write_text(yaml.safe_dump(model))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(FNS_DIR), str(EXAMPLES)]),
            "E2E_FAILURE_FREE": "1",  # unpaced (`e2efns.SLOW`)
            "NOPSTREAM_S3_ACCESS_KEY": w.access_key,
            "NOPSTREAM_S3_SECRET_KEY": w.secret_key,
            **({"NOPSTREAM_S3_CA_FILE": str(w.ca)} if w.ca is not None else {}),
        }
        err = w.workdir / f"{name}.err"
        command = ["run", f"{name}.yaml", "--quiet", "--workdir", f"run-{name}"]
        with err.open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "nopstream", *command],
                cwd=w.workdir, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
            )  # fmt: skip
        return cls(process, err, client, bucket, model["spec"]["model"]["sinks"][0]["config"]["prefix"])

    def output(self) -> Counter[str]:
        """The run's committed output, once it has ended well."""
        code = self.process.wait(timeout=300)
        assert code == 0, self.err.read_text()
        return s3_records(self.client, self.bucket, self.prefix)

    def stop(self) -> None:
        """Stop it, and every task process it forked, if a test ended before asking for its output."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def clean_run(world) -> Iterator[Callable[[Any, str, dict], CleanRun]]:
    """Starts failure-free runs (`CleanRun`) for this test; stops whatever is left at its end."""
    started: list[CleanRun] = []

    def start(client, bucket: str, model: dict) -> CleanRun:
        started.append(CleanRun.start(world, client, bucket, model))
        return started[-1]

    yield start
    for run in started:
        run.stop()


def leader(w: World, job: str) -> str:
    from nopstream.cluster.backend import StoreUnavailable
    from nopstream.cluster.election import Election
    from nopstream.cluster.layout import Layout

    async def read() -> str | None:
        backend = w.etcd_backend()
        try:
            found = await Election(backend, Layout("default", job, "main"), "test").leader()
            assert found is not None, "no coordinator leads"
            return found[0]
        except StoreUnavailable:  # the forward into the namespace, on a busy node: ask again
            return None
        finally:
            await backend.close()

    return w.wait("the leading coordinator", lambda: asyncio.run(read()))


def forged_without_the_job_s_certificate(w: World, job: str, pod: str) -> dict[str, object]:
    """What the task process of `pod` answers, at the endpoint it registered for the current run, clients
    without the job's certificate (`test_forged_requests.forge_without_the_certificate`), each sending a
    secret of their own; reached through a forward from node-0, where the NetworkPolicy admits them."""
    from urllib.parse import urlsplit

    from nopstream.cluster.backend import StoreUnavailable
    from nopstream.cluster.layout import Layout
    from nopstream.cluster.registry import Registry
    from tests.leases.test_forged_requests import forge_without_the_certificate

    assert w.cluster is not None

    async def registered() -> str | None:
        backend = w.etcd_backend()
        try:
            registry = Registry(backend, Layout("default", job, "main"))
            tasks = await registry.tasks(await registry.current_run())
            return next((r.endpoint for r in tasks.values() if r.attempt == pod), None)
        except StoreUnavailable:  # the forward into the namespace, on a busy node: ask again
            return None
        finally:
            await backend.close()

    endpoint = urlsplit(w.wait(f"{pod}'s registration", lambda: asyncio.run(registered())))
    assert endpoint.scheme == "https" and endpoint.hostname and endpoint.port, endpoint
    url = f"https://127.0.0.1:{w.cluster.forward(endpoint.hostname, endpoint.port)}/control/status"
    targets = {"kept task /control/status": ("GET", url)}
    return asyncio.run(forge_without_the_certificate(targets, "f" * 64, None, w.workdir / f"forger-{pod}"))


def running_tasks(w: World, job: str, run: int) -> list[str]:
    """The names of run `run`'s task pods that are running."""
    return [
        p["metadata"]["name"]
        for p in w.pods(job)
        if p["metadata"]["labels"].get("nopstream.io/run") == str(run)
        and p["metadata"]["labels"].get("nopstream.io/role") == "task"
        and p["status"].get("phase") == "Running"
    ]


def standing_by(w: World, job: str, run: int, tasks: tuple[str, ...]) -> bool:
    """Whether run `run + 1` has a running standby pod per task of `run` (or the job is over)."""
    over = w.job(job)["status"].get("phase") == "Succeeded"
    return over or len(running_tasks(w, job, run + 1)) >= len(tasks)


def kill_tasks(
    w: World,
    rng: random.Random,
    count: int,
    *,
    first_nonce: int,
    job: str = "wordcount",
    standby: bool = False,
) -> int:
    """Kill `count` task pods of the current run one after the other, each after the job runs again
    (and, with `standby`, once the next run's standby pods run: they come after a durable epoch)."""
    done = 0
    for nonce in range(first_nonce, first_nonce + count):
        status = w.job(job)["status"]
        if status.get("phase") == "Succeeded":
            break
        run = status["run"]
        tasks = running_tasks(w, job, run)
        if standby:
            ready = tuple(tasks)
            w.wait("the standby pods", lambda run=run, ready=ready: standing_by(w, job, run, ready))
            if w.job(job)["status"].get("phase") == "Succeeded":
                break
        w.kill(rng.choice(sorted(tasks)), nonce)
        done += 1
        w.wait(f"run {run + 1}", lambda run=run: w.job(job)["status"]["run"] > run)
        w.wait("Running again", lambda: w.job(job)["status"].get("phase") in ("Running", "Succeeded"))
    return done


def recovery_causes(w: World, job: str) -> str:
    """The job's Recovery events, each naming its cause: what a count of recoveries is checked against."""
    events = w.kubectl("get", "events", "--field-selector", f"involvedObject.name={job}", "-o", "json")
    causes = [e["message"] for e in json.loads(events)["items"] if e["reason"] == "Recovery"]
    return "recoveries:\n" + "\n".join(causes) + f"\noperator log:\n{w.operator_log()}"


def settled_state(w: World, job: str) -> dict[str, str]:
    """Resource versions of a StreamJob and of everything it owns: any write changes one."""
    state = {"streamjob": w.job(job)["metadata"]["resourceVersion"]}
    for kind in ("pods", "configmaps"):
        items = json.loads(w.kubectl("get", kind, "-l", f"nopstream.io/job={job}", "-o", "json"))["items"]
        state.update({f"{kind}/{i['metadata']['name']}": i["metadata"]["resourceVersion"] for i in items})
    return state


def operator_writes(w: World) -> list[dict]:
    """The operator's writes in our API server's audit log, but for kopf's peering keep-alives."""
    audited = w.audit()
    assert audited is not None
    return [
        e
        for e in audited
        if e.get("user", {}).get("username") == OPERATOR_USER
        and e.get("objectRef", {}).get("resource") != "clusterkopfpeerings"
    ]


def test_wordcount_survives_pod_kills_refuses_a_key_change_and_settles(world, s3_client, bucket, clean_run):
    w = world
    rng = random.Random(17)
    upload_lines(s3_client, bucket, rng, files=16, lines=2500, words=8)
    # the failure-free output, on the embedded default
    clean = clean_run(s3_client, bucket, wordcount("wc-clean", bucket, w.s3_url, "clean"))

    # with a standby pod per task: recoveries are served by them, the rescale is not
    job = wordcount("wordcount", bucket, w.pod_s3_url, "faulty", standby=True)
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("Running", lambda: w.job("wordcount").get("status", {}).get("phase") == "Running")
    table = w.kubectl("get", "streamjobs")
    assert table.split("\n")[0].split() == [
        "NAME", "PHASE", "READY", "RUN", "MODE", "DURABLE", "LAST-DURABLE", "AGE"
    ]  # fmt: skip
    assert table.split("\n")[1].split()[:5] == ["wordcount", "Running", "True", "1", "STRICT_EXACTLY_ONCE"], (
        w.kubectl("get", "events", "--sort-by=.lastTimestamp")
    )
    tasks = [p for p in w.pods("wordcount") if p["metadata"]["labels"].get("nopstream.io/run") == "1"]
    assert len(tasks) == w.job("wordcount")["status"]["tasksTotal"] == 6  # lines+split, count+out: 3 each

    # a keyed operator's key selector changes: refused, and the job keeps running as it was
    changed = wordcount(
        "wordcount", bucket, w.pod_s3_url, "faulty", key_fn="e2efns:first_letter", standby=True
    )
    w.kubectl("apply", "-f", "-", input=json.dumps(changed))
    condition = w.wait(
        "the change refused",
        lambda: next(
            (
                c
                for c in w.job("wordcount").get("status", {}).get("conditions", [])
                if c["type"] == "SpecChange"
            ),
            None,
        ),
    )
    assert condition["reason"] == "Refused", condition
    assert "REFUSED" in condition["message"] and "count" in condition["message"]
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=wordcount", "-o", "json")
    assert "SpecChangeRefused" in {e["reason"] for e in json.loads(events)["items"]}

    # two task pods killed; parallelism 3 -> 4 (a rescale from a stop savepoint); three more
    # task pods killed; then the leading coordinator
    kills = kill_tasks(w, rng, 2, first_nonce=1, standby=True)
    run = w.job("wordcount")["status"]["run"]
    served = {
        p["metadata"]["name"]: p["metadata"]["labels"].get("nopstream.io/standby")
        for p in w.pods("wordcount")
        if p["metadata"]["labels"].get("nopstream.io/run") == str(run)
    }
    # the killed pod's task went to its standby; the pods that still ran were kept
    assert len(served) == 6 and "true" in served.values(), f"{served}\n{recovery_causes(w, 'wordcount')}"
    fingerprint = w.job("wordcount")["status"]["planFingerprint"]
    rescaled = wordcount("wordcount", bucket, w.pod_s3_url, "faulty", parallelism=4, standby=True)
    w.kubectl("apply", "-f", "-", input=json.dumps(rescaled))
    w.wait(
        "the rescaled plan running",
        lambda: (
            (s := w.job("wordcount")["status"])["planFingerprint"] != fingerprint
            and s.get("phase") in ("Running", "Succeeded")
        ),
        timeout=180,
    )
    status = w.job("wordcount")["status"]
    assert status["tasksTotal"] == 8 and status["savepoints"], status
    condition = next(c for c in status["conditions"] if c["type"] == "SpecChange")
    assert condition["reason"] == "Redeployed", condition
    kills += kill_tasks(w, rng, 3, first_nonce=10)
    coordinator = leader(w, "wordcount")
    run_before = w.job("wordcount")["status"]["run"]
    w.kill(coordinator, 99)
    release(s3_client, bucket)
    w.wait("Succeeded", lambda: w.job("wordcount")["status"].get("phase") == "Succeeded", timeout=400)
    status = w.job("wordcount")["status"]
    assert kills == 5, "the job ended before five kills"
    # one run per recovery, one for the rescale; none for the coordinator
    assert status["recoveries"] == 5 and status["run"] == 7 == run_before, recovery_causes(w, "wordcount")
    got, expected = s3_records(s3_client, bucket, "faulty/"), clean.output()
    assert sum(expected.values()) == 16 * 2500 * 8
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=wordcount", "-o", "json")
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"Recovery", "Upgrade", "Savepoint", "Upgraded", "Succeeded", "SpecChangeRefused"} <= reasons

    # passes over the finished, unchanged job write nothing
    state = settled_state(w, "wordcount")
    before = len(operator_writes(w)) if w.cluster else 0
    time.sleep(6)
    assert settled_state(w, "wordcount") == state
    if w.cluster:
        assert len(operator_writes(w)) == before, operator_writes(w)[before:]


def test_an_invalid_streamjob_becomes_invalid_and_creates_nothing(world):
    w = world
    bad = wordcount("broken", "no-bucket", "http://127.0.0.1:9", "out")
    bad["spec"]["model"]["operators"][0]["inputs"] = ["lines2"]
    w.kubectl("apply", "-f", "-", input=json.dumps(bad))
    w.wait("Invalid", lambda: w.job("broken").get("status", {}).get("phase") == "Invalid")
    described = w.kubectl("describe", "streamjob", "broken")
    assert "spec.model.operators[0].inputs[0]: unknown node 'lines2' (rule: inputs-exist)" in described
    time.sleep(3)
    assert w.pods("broken") == []
    assert w.kubectl("get", "configmaps", "-l", "nopstream.io/job=broken", "-o", "name") == ""


def test_twelve_streamjobs_at_once_are_each_driven(world):
    """More StreamJobs than kopf's thread pool has threads (6 on 2 cores): a daemon that held a
    thread for its job's whole life left every job past the sixth untouched."""
    w = world
    names = [f"many-{i}" for i in range(12)]
    for name in names:
        bad = wordcount(name, "no-bucket", "http://127.0.0.1:9", "out")
        bad["spec"]["model"]["operators"][0]["inputs"] = ["nowhere"]
        w.kubectl("apply", "-f", "-", input=json.dumps(bad))
    phases = lambda: [w.job(n).get("status", {}).get("phase") for n in names]  # noqa: E731
    w.wait("every job Invalid", lambda: phases() == ["Invalid"] * len(names), timeout=60)
    w.kubectl("delete", "streamjob", *names, "--wait=true", "--timeout=60s")


def test_a_checkpoint_namespace_held_in_another_namespace_is_refused_naming_the_holder(world):
    """Two StreamJobs of one name in two Kubernetes namespaces, given one explicit checkpointNamespace
    and storage: the second waits, creating nothing, naming the first; deleted, the first lets go and
    the second deploys."""
    w = world
    w.kubectl("create", "namespace", "team-b")
    first = wordcount("shared-cp", "no-bucket", "http://127.0.0.1:9", "out")
    first["spec"]["checkpointNamespace"] = "shared/wordcount"
    second = {**first, "metadata": {"name": "shared-cp", "namespace": "team-b"}}
    try:
        w.kubectl("apply", "-f", "-", input=json.dumps(first))
        w.wait("the first deployed", lambda: w.job("shared-cp").get("status", {}).get("run"))
        w.kubectl("apply", "-f", "-", input=json.dumps(second))

        def theirs() -> dict:
            return json.loads(w.kubectl("get", "streamjob", "shared-cp", "-n", "team-b", "-o", "json"))

        def held() -> dict | None:
            job = theirs()
            ready = [c for c in job.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
            return job if ready and ready[0]["reason"] == "CheckpointNamespaceHeld" else None

        refused = w.wait("the second refused", held)
        ready = next(c for c in refused["status"]["conditions"] if c["type"] == "Ready")
        assert ready["message"] == (
            "checkpoint namespace 'shared/wordcount' in s3 http://127.0.0.1:9 no-bucket/cp-out is held by"
            " StreamJob default/shared-cp (one StreamJob per checkpoint namespace; delete that StreamJob or"
            " give this one another checkpointNamespace)"
        )
        assert refused["status"]["phase"] == "Pending" and "run" not in refused["status"]
        assert (
            w.kubectl("get", "configmaps,pods", "-n", "team-b", "-l", "nopstream.io/job", "-o", "name") == ""
        )
        w.kubectl("delete", "streamjob", "shared-cp", "--wait=true", "--timeout=60s")
        w.wait("the second deployed", lambda: theirs().get("status", {}).get("run") == 1)
    finally:
        w.kubectl("delete", "streamjob", "shared-cp", "--ignore-not-found", "--wait=true", "--timeout=60s")
        w.kubectl("delete", "namespace", "team-b", "--wait=false")


def test_a_savepoint_on_request_then_suspend_and_resume(world, s3_client, bucket, clean_run):
    w = world
    upload_lines(s3_client, bucket, random.Random(5), files=8, lines=2000, words=6)
    clean = clean_run(s3_client, bucket, wordcount("pause-clean", bucket, w.s3_url, "clean", parallelism=2))
    job = wordcount("pausable", bucket, w.pod_s3_url, "paused", parallelism=2)
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("Running", lambda: w.job("pausable").get("status", {}).get("phase") == "Running")

    def patch(spec: dict) -> None:
        w.kubectl("patch", "streamjob", "pausable", "--type", "merge", "-p", json.dumps({"spec": spec}))

    patch({"savepointNonce": "first"})
    saved = w.wait(
        "the requested savepoint",
        lambda: [s for s in w.job("pausable")["status"].get("savepoints", []) if s.get("nonce") == "first"],
    )
    patch({"suspend": True})
    w.wait("Suspended", lambda: w.job("pausable")["status"].get("phase") == "Suspended")
    w.wait("no pods", lambda: w.pods("pausable") == [])
    status = w.job("pausable")["status"]
    assert status["suspendedAt"] > saved[0]["epoch"]
    run = status["run"]
    patch({"suspend": False})
    release(s3_client, bucket)
    w.wait("Succeeded", lambda: w.job("pausable")["status"].get("phase") == "Succeeded", timeout=300)
    status = w.job("pausable")["status"]
    assert status["run"] == run + 1 and status["recoveries"] == 0
    got, expected = s3_records(s3_client, bucket, "paused/"), clean.output()
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=pausable", "-o", "json")
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"SavepointRequested", "Savepoint", "Suspend", "Suspended", "Resumed", "Succeeded"} <= reasons

    # deleting the StreamJob removes its pods and plan ConfigMaps behind the finalizer; checkpoints stay
    assert "nopstream.io/finalizer" in w.job("pausable")["metadata"]["finalizers"]
    checkpoints = sorted(
        o.object_name for o in s3_client.list_objects(bucket, prefix="cp-paused/", recursive=True)
    )
    assert checkpoints
    w.kubectl("delete", "streamjob", "pausable", "--wait=true", "--timeout=60s")
    w.wait("the pods gone", lambda: w.pods("pausable") == [])
    assert w.kubectl("get", "configmaps", "-l", "nopstream.io/job=pausable", "-o", "name") == ""
    after = sorted(o.object_name for o in s3_client.list_objects(bucket, prefix="cp-paused/", recursive=True))
    assert after == checkpoints


def leader_view(w: World, job: str, leader_pod: str) -> dict[str, Any]:
    """The job's view (GET /api/v1/job) through its leader Service, once its one endpoint is the leader."""
    assert w.cluster is not None

    def endpoints() -> list[str]:
        found = w.kubectl(
            "get", "endpointslices", "-l", f"kubernetes.io/service-name={job}-leader", "-o", "json"
        )
        return [
            a for s in json.loads(found)["items"] for e in s.get("endpoints") or [] for a in e["addresses"]
        ]

    pod_ip = json.loads(w.kubectl("get", "pod", leader_pod, "-o", "json"))["status"]["podIP"]
    w.wait("the leader Service's one endpoint", lambda: endpoints() == [pod_ip], timeout=30)
    data = json.loads(w.kubectl("get", "secret", f"{job}-secret", "-o", "json"))["data"]
    port = w.cluster.service_port(f"{job}-leader", 7700)
    headers = {"Authorization": f"Bearer {base64.b64decode(data['secret']).decode()}"}
    # as a person's browser: the job's CA trusted, no client certificate (the dashboard's API takes none)
    context = ssl.create_default_context(cadata=base64.b64decode(data["ca.crt"]).decode())
    context.check_hostname = False
    request = urllib.request.Request(f"https://127.0.0.1:{port}/api/v1/job", headers=headers)
    with urllib.request.urlopen(request, timeout=10, context=context) as r:
        view: dict[str, Any] = json.loads(r.read())
    assert view["leader"]["holder"] == leader_pod and view["job"]["jobId"] == job, view["leader"]
    return view


def condition(w: World, job: str, kind: str) -> dict:
    return next((c for c in w.job(job)["status"].get("conditions", []) if c["type"] == kind), {})


def test_a_stopped_task_turns_ready_false_then_fails_its_pod_and_the_recovered_job_is_ready(
    world, s3_client, bucket, clean_run
):
    w = world
    if w.cluster is None:
        pytest.skip("stopping a container's process needs the suite's own node")
    upload_lines(s3_client, bucket, random.Random(23), files=6, lines=1500, words=6)
    clean = clean_run(s3_client, bucket, wordcount("stall-clean", bucket, w.s3_url, "clean", parallelism=2))
    job = wordcount("stalls", bucket, w.pod_s3_url, "stalled", parallelism=2)
    job["spec"]["checkpoint"]["timeoutMs"] = 2000  # Ready's bound: 0.5 s interval + 2 s timeout
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.kubectl("wait", "--for=condition=Ready", "streamjob/stalls", "--timeout=180s")
    w.wait("an epoch durable", lambda: w.job("stalls")["status"].get("latestDurableEpoch"))
    status = w.job("stalls")["status"]
    assert status["leader"]["pod"].startswith("stalls-coordinator-") and status["leader"]["token"] > 0
    # a loaded node stalls epochs past the 2.5 s bound now and then: Degraded comes and goes
    w.wait("Degraded=False", lambda: condition(w, "stalls", "Degraded")["status"] == "False", timeout=60)
    assert leader_view(w, "stalls", status["leader"]["pod"])["leader"]["token"] == status["leader"]["token"]
    run = status["run"]

    def source_pod() -> dict[str, Any] | None:
        """The run's first source task's pod, once its container runs (a loaded node restarts one
        whose probe timed out; its status names the container it starts next)."""
        for p in w.pods("stalls"):
            labels = p["metadata"]["labels"]
            if (labels.get("nopstream.io/run"), labels.get("nopstream.io/vertex")) != (str(run), "lines"):
                continue
            if labels.get("nopstream.io/subtask") == "0":
                with contextlib.suppress(LookupError, KeyError, IndexError):
                    if p["status"]["containerStatuses"][0]["containerID"]:
                        return p
        assert w.job("stalls")["status"].get("phase") == "Running", (
            "the job ended before its task was stopped"
        )
        return None

    # frozen, the pod's process and the task process it forked: its pod still Running, its TCP
    # port still accepting
    nemesis.pause(w, w.wait("the source task's container running", source_pod, timeout=60))
    stopped = time.monotonic()
    stalled = w.wait(
        "Ready=False (EpochsStalled)",
        lambda: (c := condition(w, "stalls", "Ready")).get("reason") == "EpochsStalled" and c,
        timeout=60,
    )
    took = time.monotonic() - stopped
    assert stalled["status"] == "False" and stalled["message"].startswith(
        "no epoch became durable for longer than 2.5 s (checkpoint interval + timeout)"
    )
    assert condition(w, "stalls", "Degraded")["reason"] == "EpochsStalled"
    assert w.job("stalls")["status"]["phase"] == "Running"  # the pods look fine; the status does not
    # the bound, a pass and the durable epoch's age in whole seconds; the liveness probe needs ~15 s
    assert took < 2.5 + 6, f"Ready turned False {took:.1f} s after the task stopped"
    # the liveness probe fails the stopped task's pod; the job recovers and is Ready again
    w.wait("a recovery", lambda: w.job("stalls")["status"]["run"] > run, timeout=90)
    w.kubectl("wait", "--for=condition=Ready", "streamjob/stalls", "--timeout=180s")
    w.wait(
        "Degraded=False again", lambda: condition(w, "stalls", "Degraded")["status"] == "False", timeout=60
    )
    release(s3_client, bucket)
    w.wait("Succeeded", lambda: w.job("stalls")["status"].get("phase") == "Succeeded", timeout=300)
    got, expected = s3_records(s3_client, bucket, "stalled/"), clean.output()
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=stalls", "-o", "json")
    assert {"EpochsStalled", "Recovery"} <= {e["reason"] for e in json.loads(events)["items"]}


def test_a_job_that_keeps_failing_is_failed_after_its_recoveries(world, s3_client, bucket):
    w = world
    upload_lines(s3_client, bucket, random.Random(3), files=2, lines=10, words=3)
    job = wordcount("doomed", bucket, w.pod_s3_url, "doomed", parallelism=1)
    job["spec"]["maxRecoveries"] = 2
    job["spec"]["model"]["operators"][0]["fn"] = "e2efns:explode"
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("Failed", lambda: w.job("doomed").get("status", {}).get("phase") == "Failed", timeout=180)
    status = w.job("doomed")["status"]
    assert (status["recoveries"], status["run"]) == (2, 3)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "TooManyRecoveries" and "after 2 recoveries" in ready["message"]
    w.wait("no pods", lambda: w.pods("doomed") == [])
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=doomed", "-o", "json")
    assert [e["reason"] for e in json.loads(events)["items"]].count("Recovery") == 2


def test_a_finished_job_applied_again_recreated_and_restarted_emits_each_lineage_once(
    world, s3_client, bucket
):
    w = world
    upload_lines(s3_client, bucket, random.Random(8), files=4, lines=300, words=5)
    job = wordcount("again", bucket, w.pod_s3_url, "again", parallelism=2)

    def objects(lineage: int) -> dict[str, bytes]:
        out = {}
        for o in s3_client.list_objects(bucket, prefix="again/"):
            if f".l{lineage}." in o.object_name:
                body = s3_client.get_object(bucket, o.object_name)
                out[o.object_name] = body.read()
                body.close()
                body.release_conn()
        return out

    def succeeded() -> bool:
        return w.job("again").get("status", {}).get("phase") == "Succeeded"

    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("Succeeded", succeeded, timeout=180)
    first = objects(1)
    assert first and sum(len(v.splitlines()) for v in first.values()) > 0
    run = w.job("again")["status"]["run"]

    # applied again unchanged: still Succeeded, nothing started, nothing re-emitted
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    time.sleep(4)
    assert succeeded() and w.job("again")["status"]["run"] == run
    assert objects(1) == first

    # deleted and applied again under the same name: a new run that finds the job finished
    w.kubectl("delete", "streamjob", "again", "--wait=true", "--timeout=60s")
    w.wait("the pods gone", lambda: w.pods("again") == [])
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("Succeeded again", lambda: succeeded() and w.job("again")["status"]["run"] > run, timeout=180)
    assert objects(1) == first and objects(2) == {}

    # a restart nonce starts it over: lineage 2, the same records once more, lineage 1 untouched
    run = w.job("again")["status"]["run"]
    w.kubectl(
        "patch", "streamjob", "again", "--type", "merge", "-p", json.dumps({"spec": {"restartNonce": "r1"}})
    )
    # woken by the new generation: a finished job's passes are SETTLED_PASS_SECONDS (30 s) apart
    w.wait("restarted", lambda: w.job("again")["status"]["run"] > run, timeout=20)
    w.wait("Succeeded after the restart", succeeded, timeout=180)
    assert objects(1) == first
    second = objects(2)
    lines = sorted(line for v in second.values() for line in v.splitlines())
    assert lines == sorted(line for v in first.values() for line in v.splitlines())
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=again", "-o", "json")
    assert "Restarted" in {e["reason"] for e in json.loads(events)["items"]}


def test_jobs_whose_joined_names_match_run_side_by_side_and_a_foreign_pod_is_never_adopted(
    world, s3_client, bucket
):
    w = world
    upload_lines(s3_client, bucket, random.Random(9), files=2, lines=50, words=3)

    def succeeded(name: str) -> bool:
        return w.job(name).get("status", {}).get("phase") == "Succeeded"

    # job 'nc-x' with source 'lines' and job 'nc' with source 'x-lines' would both join to nc-x-lines-0
    first = wordcount("nc-x", bucket, w.pod_s3_url, "nc1", parallelism=1)
    second = wordcount("nc", bucket, w.pod_s3_url, "nc2", parallelism=1)
    second["spec"]["model"]["sources"][0]["id"] = "x-lines"
    for job in (first, second):
        w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("both Succeeded", lambda: succeeded("nc-x") and succeeded("nc"), timeout=180)
    output = s3_records(s3_client, bucket, "nc1/")
    assert output and s3_records(s3_client, bucket, "nc2/") == output

    # a pod of somebody else's that holds the name of a task pod: the job waits and touches it not
    foreign = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ncf-lines-0-r1", "namespace": "default"},
        "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "busybox"}]},
    }
    w.kubectl("apply", "-f", "-", input=json.dumps(foreign))
    before = json.loads(w.kubectl("get", "pod", "ncf-lines-0-r1", "-o", "json"))["metadata"]
    w.kubectl(
        "apply", "-f", "-", input=json.dumps(wordcount("ncf", bucket, w.pod_s3_url, "nc3", parallelism=1))
    )
    ready = w.wait(
        "the name conflict",
        lambda: next(
            (
                c
                for c in w.job("ncf").get("status", {}).get("conditions", [])
                if c.get("reason") == "NameConflict"
            ),
            None,
        ),
    )
    assert ready["type"] == "Ready" and ready["status"] == "False"
    assert ready["message"] == (
        "Pod default/ncf-lines-0-r1 exists and is not this job's: remove it or rename this job"
    )
    assert w.job("ncf")["status"]["phase"] == "Pending"
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=ncf", "-o", "json")
    assert "NameConflict" in {e["reason"] for e in json.loads(events)["items"]}
    after = json.loads(w.kubectl("get", "pod", "ncf-lines-0-r1", "-o", "json"))["metadata"]
    assert (after["uid"], after["resourceVersion"]) == (before["uid"], before["resourceVersion"])
    assert "ownerReferences" not in after and s3_records(s3_client, bucket, "nc3/") == Counter()

    # once the foreign pod is gone the job runs, to the same output
    w.kubectl("delete", "pod", "ncf-lines-0-r1", "--grace-period=0", "--force", "--wait=true")
    w.wait("ncf Succeeded", lambda: succeeded("ncf"), timeout=180)
    assert s3_records(s3_client, bucket, "nc3/") == output
    for name in ("nc", "nc-x", "ncf"):
        w.kubectl("delete", "streamjob", name, "--wait=true", "--timeout=60s")


def test_a_kafka_job_on_the_cluster_counts_every_committed_line_once_through_pod_kills(
    world, bucket, kafka, broker
):
    from tests.chaos.jobs import fill_kafka

    w = world
    rng = random.Random(29)
    source = fill_kafka(kafka, rng, partitions=3, lines=800)
    out = kafka.create("counts", partitions=2)
    words = Counter(word for line in kafka.committed(source) for word in json.loads(line).split())
    assert "aborted" not in words and sum(words.values()) == 3 * 800 * 6
    job = wordcount("kafka-wc", bucket, w.pod_s3_url, "unused", parallelism=2)
    model = job["spec"]["model"]
    model["sources"] = [
        {
            "id": "lines",
            "type": "kafka",
            "config": {"bootstrapServers": broker.pods, "topic": source, "bounded": True},
        }
    ]
    model["sinks"] = [
        {
            "id": "out",
            "type": "kafka",
            "config": {"bootstrapServers": broker.pods, "topic": out, "keyField": "key"},
        }
    ]
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("Running", lambda: w.job("kafka-wc").get("status", {}).get("phase") == "Running")
    kills = kill_tasks(w, rng, 2, first_nonce=200, job="kafka-wc")
    w.wait("Succeeded", lambda: w.job("kafka-wc")["status"].get("phase") == "Succeeded", timeout=300)
    assert kills >= 1 and w.job("kafka-wc")["status"]["recoveries"] == kills, recovery_causes(w, "kafka-wc")
    # a rolling count: word w with N occurrences is published as counts 1..N, each exactly once
    expected = Counter(
        json.dumps({"key": k, "value": v}, sort_keys=True) for k, n in words.items() for v in range(1, n + 1)
    )
    got = kafka.committed(out)
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
    w.kubectl("delete", "streamjob", "kafka-wc", "--wait=true", "--timeout=60s")


PROBE = """
import json, socket, sys, time
from concurrent.futures import ThreadPoolExecutor
def reach(target):
    host, port = target.rsplit(":", 1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return "reached"
        except OSError:
            time.sleep(0.5)
    return "blocked"
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    print(json.dumps(dict(zip(sys.argv[1:], pool.map(reach, sys.argv[1:])))))
"""
"""Which targets a pod opens a TCP connection to within 20 s (each retried: the enforcer admits a
new pod's address a moment after it starts, and refuses before)."""


def probes(
    w: World, pods: dict[str, tuple[str, dict[str, str]]], targets: list[str]
) -> dict[str, dict[str, str]]:
    """For each probe pod, by name (its node, its labels), which of `targets` (host:port) it
    reached; the pods run side by side."""
    for name, (node, labels) in pods.items():
        container = {"name": "probe", "image": E2E_IMAGE, "command": ["python", "-c", PROBE, *targets]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [container]},
        }
        w.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def ended() -> dict[str, str]:
        phases = {
            n: json.loads(w.kubectl("get", "pod", n, "-o", "json"))["status"].get("phase") for n in pods
        }
        return phases if all(p in ("Succeeded", "Failed") for p in phases.values()) else {}

    phases = w.wait("the probes", ended)
    logs = {name: w.kubectl("logs", name) for name in pods}
    w.kubectl("delete", "pod", *pods, "--wait=false")
    assert set(phases.values()) == {"Succeeded"}, logs
    return {name: json.loads(out) for name, out in logs.items()}


def test_the_network_policy_admits_the_job_s_own_pods_and_the_operator_only(world, bucket, kafka, broker):
    # kube-router enforces NetworkPolicies on every node; a job that keeps running (an empty topic)
    w = world
    source, out = kafka.create("quiet", partitions=2), kafka.create("quiet-out", partitions=1)
    job = wordcount("fenced", bucket, w.pod_s3_url, "unused", parallelism=2)
    job["spec"]["model"]["sources"] = [
        {"id": "lines", "type": "kafka", "config": {"bootstrapServers": broker.pods, "topic": source}}
    ]
    job["spec"]["model"]["sinks"] = [
        {
            "id": "out",
            "type": "kafka",
            "config": {"bootstrapServers": broker.pods, "topic": out, "keyField": "key"},
        }
    ]
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("Running", lambda: w.job("fenced").get("status", {}).get("phase") == "Running")
    pods = [p for p in w.pods("fenced") if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
    targets = sorted(
        f"{p['status']['podIP']}:{p['spec']['containers'][0]['ports'][0]['containerPort']}" for p in pods
    )
    minio = json.loads(w.kubectl("get", "pods", "-l", "app.kubernetes.io/component=minio", "-o", "json"))
    unfenced = f"{minio['items'][0]['status']['podIP']}:9000"  # no policy selects it: a probe that works
    reached, blocked = dict.fromkeys(targets, "reached"), dict.fromkeys(targets, "blocked")
    kinds = {"stray": {}, "other": {"nopstream.io/job": "another-job"}, "own": {"nopstream.io/job": "fenced"}}
    got = probes(
        w,
        {f"{kind}-{node}": (node, labels) for kind, labels in kinds.items() for node in ("node-0", "node-1")},
        [*targets, unfenced],
    )
    for node in ("node-0", "node-1"):
        # a stray pod and a pod of another job reach no pod of the job, on either node, while MinIO
        # (no policy selects it) answers them; a pod with the job's label is one of its own
        assert got[f"stray-{node}"] == {**blocked, unfenced: "reached"}
        assert got[f"other-{node}"] == {**blocked, unfenced: "reached"}
        assert got[f"own-{node}"] == {**reached, unfenced: "reached"}
    # the operator reaches the leading coordinator: a savepoint it asks for is taken
    w.kubectl(
        "patch", "streamjob", "fenced", "--type", "merge", "-p", json.dumps({"spec": {"savepointNonce": "p"}})
    )
    w.wait(
        "the operator's savepoint",
        lambda: [s for s in w.job("fenced")["status"].get("savepoints", []) if s.get("nonce") == "p"],
    )
    assert w.job("fenced")["status"]["recoveries"] == 0, recovery_causes(w, "fenced")
    w.kubectl("delete", "streamjob", "fenced", "--wait=true", "--timeout=60s")


def enrichment(name: str, bucket: str, minio_url: str, out: str) -> dict:
    """`examples/enrichment.yaml` on S3: its orders and tiers from objects under enrich/, each paced
    5 ms a record (`e2efns:pace`), its enriched orders and late records to `out`/."""
    example = yaml.safe_load((EXAMPLES / "enrichment.yaml").read_text())["spec"]["model"]
    job = wordcount(name, bucket, minio_url, out, parallelism=2)
    s3 = {"endpoint": minio_url, "bucket": bucket}
    for source in example["sources"]:
        source |= {"type": "s3", "config": s3 | {"prefix": f"enrich/{source['id']}/", "format": "jsonl"}}
    (join,) = example["operators"]
    join["inputs"] = [f"pace-{side}" for side in join["inputs"]]
    paces = [
        {"id": f"pace-{s['id']}", "type": "map", "inputs": [s["id"]], "fn": "e2efns:pace"}
        for s in example["sources"]
    ]
    example["operators"] = [*paces, join]
    for sink in example["sinks"]:
        sink |= {"type": "s3", "config": s3 | {"prefix": f"{out}/{sink['id']}/"}}
    job["spec"]["model"] = example
    return job


def test_the_enrichment_example_on_the_cluster_is_exact_through_pod_kills(
    world, s3_client, bucket, clean_run
):
    w = world
    for name in ("orders", "tiers"):
        data = (EXAMPLES / "data" / "enrichment" / f"{name}.jsonl").read_bytes()
        s3_client.put_object(bucket, f"enrich/{name}/{name}.jsonl", io.BytesIO(data), len(data))
    clean = clean_run(s3_client, bucket, enrichment("enrich-clean", bucket, w.s3_url, "enrich-clean"))
    w.kubectl("apply", "-f", "-", input=json.dumps(enrichment("enrichment", bucket, w.pod_s3_url, "enrich")))
    w.wait(
        "Running", lambda: w.job("enrichment").get("status", {}).get("phase") == "Running", job="enrichment"
    )
    first = running_tasks(w, "enrichment", 1)
    kills = kill_tasks(w, random.Random(31), 2, first_nonce=300, job="enrichment")
    if w.cluster is not None:  # a task pod kept through both recoveries, reached as any pod could
        kept = sorted(set(first) & set(running_tasks(w, "enrichment", w.job("enrichment")["status"]["run"])))
        assert kept, (first, recovery_causes(w, "enrichment"))
        assert forged_without_the_job_s_certificate(w, "enrichment", kept[0]) == {
            f"{who}: kept task /control/status": answer
            for who, answer in (
                ("plain http", "disconnected"),
                ("no certificate", 401),  # nor the job's secret: 403 for the certificate comes after
                ("another job's certificate", "disconnected"),
            )
        }
    release(s3_client, bucket)
    w.wait("Succeeded", lambda: w.job("enrichment")["status"].get("phase") == "Succeeded", timeout=300)
    assert kills == 2 and w.job("enrichment")["status"]["recoveries"] == 2, recovery_causes(w, "enrichment")
    clean.output()
    for sink in ("enriched", "late-records"):
        got, expected = (
            s3_records(s3_client, bucket, f"enrich/{sink}/"),
            s3_records(s3_client, bucket, f"enrich-clean/{sink}/"),
        )
        assert expected and got == expected, (
            f"{sink}: lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
        )
    orders = (EXAMPLES / "data" / "enrichment" / "orders.jsonl").read_text().count("\n")
    assert (
        sum(s3_records(s3_client, bucket, "enrich/enriched/").values())
        + sum(1 for r in s3_records(s3_client, bucket, "enrich/late-records/").elements() if "amount" in r)
        == orders
    )  # every order enriched or late, once
    w.kubectl("delete", "streamjob", "enrichment", "--wait=true", "--timeout=60s")


def test_a_job_whose_sink_cannot_start_fails_at_once_naming_why(world, bucket, kafka, broker):
    # A refused start is the same in every run: no recovery, the task and the cause in the status.
    w = world
    source = kafka.create("lines", partitions=1)
    job = wordcount("no-topic", bucket, w.pod_s3_url, "unused", parallelism=1)
    model = job["spec"]["model"]
    model["sources"] = [
        {"id": "lines", "type": "kafka", "config": {"bootstrapServers": broker.pods, "topic": source}}
    ]
    model["sinks"] = [
        {"id": "out", "type": "kafka", "config": {"bootstrapServers": broker.pods, "topic": "nowhere"}}
    ]
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("Failed", lambda: w.job("no-topic").get("status", {}).get("phase") == "Failed", timeout=120)
    status = w.job("no-topic")["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (status.get("recoveries"), status["run"], ready["reason"]) == (0, 1, "CannotStart")
    pod, _, why = ready["message"].partition(": ")
    assert pod.startswith("no-topic-count-0-") and pod.endswith("-r1"), ready["message"]
    assert why == (
        f"cannot start: kafka sink 'out': topic 'nowhere' does not exist on {broker.pods} (create it first)"
    )
    w.wait("no pods", lambda: w.pods("no-topic") == [])
    w.kubectl("delete", "streamjob", "no-topic", "--wait=true", "--timeout=60s")


NEMESIS_FAULTS = 10


def test_a_job_through_partitions_and_pauses_of_the_nemesis_is_exact(world, s3_client, bucket, clean_run):
    """Ten seeded faults (`nemesis.py`: every kind once, a task pod, the leading coordinator and
    the worker node partitioned, the leader and a task paused), each healed after 2-9 s (a node
    cut 4-20 s), the next once the job runs again with a new durable epoch: the output equals a
    failure-free run's. NOPSTREAM_NEMESIS_SEED replays a run's faults."""
    w = world
    if w.cluster is None:
        pytest.skip("partitions and pauses need the suite's own cluster")
    seed = int(os.environ.get("NOPSTREAM_NEMESIS_SEED") or random.randrange(1 << 32))
    upload_lines(s3_client, bucket, random.Random(seed), files=64, lines=2500, words=4)
    clean = clean_run(s3_client, bucket, wordcount("nemesis-clean", bucket, w.s3_url, "clean"))
    w.kubectl("apply", "-f", "-", input=json.dumps(wordcount("nemesis", bucket, w.pod_s3_url, "out")))
    w.wait("an epoch durable", lambda: w.job("nemesis").get("status", {}).get("latestDurableEpoch"))
    faults = nemesis.unleash(w, "nemesis", random.Random(seed), NEMESIS_FAULTS)
    release(s3_client, bucket)
    said = f"seed {seed}: {faults}\n{recovery_causes(w, 'nemesis')}"
    assert len(faults) == NEMESIS_FAULTS, f"the job ended before {NEMESIS_FAULTS} faults; {said}"
    w.wait("Succeeded", lambda: w.job("nemesis")["status"].get("phase") == "Succeeded", timeout=600)
    got, expected = s3_records(s3_client, bucket, "out/"), clean.output()
    assert sum(expected.values()) == 64 * 2500 * 4
    lost, doubled = sum((expected - got).values()), sum((got - expected).values())
    assert got == expected, f"lost {lost}, doubled {doubled}; {said}"
    print(
        f"\nnemesis {said}\nrecoveries: {w.job('nemesis')['status'].get('recoveries')}"
    )  # with -s: what it did


def test_a_lost_node_s_pods_are_replaced_on_the_other_node_and_the_output_is_exact(
    world, s3_client, bucket, clean_run
):
    """node-1 lost with the job's pods on it (every process of the node killed at once, its link
    gone): the operator replaces them without Kubernetes' five-minute eviction, in one recovery
    (their peers' failure reports come first; the pods of node-1 do not answer, so none is kept and
    the new ones go to node-0), and the output equals a failure-free run's. node-1 is started again
    after."""
    w = world
    if w.cluster is None:
        pytest.skip("losing a node needs the suite's own cluster")
    upload_lines(s3_client, bucket, random.Random(41), files=16, lines=2500, words=6)
    clean = clean_run(s3_client, bucket, wordcount("node-clean", bucket, w.s3_url, "clean"))
    w.kubectl("apply", "-f", "-", input=json.dumps(wordcount("node-loss", bucket, w.pod_s3_url, "out")))
    w.wait("an epoch durable", lambda: w.job("node-loss").get("status", {}).get("latestDurableEpoch"))
    status = w.job("node-loss")["status"]
    on_node_1 = [
        p["metadata"]["name"]
        for p in w.pods("node-loss")
        if p["spec"].get("nodeName") == "node-1"
        and p["metadata"]["labels"].get("nopstream.io/role") == "task"
    ]
    assert on_node_1 and status["phase"] == "Running", (
        status,
        [p["spec"].get("nodeName") for p in w.pods("node-loss")],
    )
    try:
        lost = time.monotonic()
        w.cluster.kill_node("node-1")
        w.wait("a new run", lambda: w.job("node-loss")["status"]["run"] > status["run"], timeout=120)
        replaced = time.monotonic() - lost
        w.wait(
            "Running or Succeeded again",
            lambda: w.job("node-loss")["status"].get("phase") in ("Running", "Succeeded"),
        )
        release(s3_client, bucket)
        w.wait("Succeeded", lambda: w.job("node-loss")["status"].get("phase") == "Succeeded", timeout=400)
    finally:
        w.cluster.restart_node("node-1")
    # the failure reports' grace (3 s) and one pass, or the node lifecycle controller's (12 s here):
    # not the 300 s eviction
    assert replaced < 60, replaced
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=node-loss", "-o", "json")
    causes = [e["message"] for e in json.loads(events)["items"] if e["reason"] == "Recovery"]
    final = w.job("node-loss")["status"]
    assert (final["run"], final["recoveries"]) == (status["run"] + 1, 1), causes  # one recovery
    (cause,) = causes
    silent = cause.partition("do not answer: ")[2].split(", ")
    assert "(its node node-1 is lost)" in cause or set(on_node_1) <= set(silent), cause
    assert {p["spec"].get("nodeName") for p in w.pods("node-loss")} == {
        NODE_NAME
    }  # made while node-1 was lost
    got, expected = s3_records(s3_client, bucket, "out/"), clean.output()
    assert sum(expected.values()) == 16 * 2500 * 6
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"


def test_the_cluster_s_etcd_and_minio_refuse_whoever_lacks_the_jobs_credentials(world, tmp_path):
    # the servers every job and the operator use: TLS only, etcd checking certificates and users
    import urllib3
    from minio import Minio
    from minio.error import InvalidResponseError, S3Error

    from nopstream.cluster.backend import StoreRefused, StoreUnavailable
    from nopstream.cluster.etcd import EtcdBackend
    from nopstream.cluster.etcd_access import read_access

    w = world
    assert w.pki is not None and w.ca is not None
    host, _, port = w.etcd.rpartition(":")

    async def put(backend: EtcdBackend) -> bytes | None:
        try:
            await backend.put("/nopstream-test/e2e-access", b"v")
            entry = await backend.get("/nopstream-test/e2e-access")
            return entry.value if entry is not None else None
        finally:
            await backend.close()

    assert asyncio.run(put(w.etcd_backend())) == b"v"  # the jobs' credentials
    with pytest.raises(StoreUnavailable):  # no TLS: the server closes the connection
        asyncio.run(put(EtcdBackend(host, int(port), timeout=3)))
    stranger = read_access(w.pki.etcd_access(tmp_path / "stranger", "stranger"))  # the same CA, another user
    with pytest.raises(StoreRefused, match=r"etcd refused this client \(etcdserver: permission denied\)"):
        asyncio.run(put(EtcdBackend(host, int(port), timeout=3, access=stranger)))

    endpoint = w.s3_url.split("://", 1)[1]
    trusted = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(w.ca), retries=False)
    assert w.s3_client().bucket_exists("e2e-no-such-bucket") is False  # the jobs' credentials
    with pytest.raises(urllib3.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):  # this machine's CAs
        Minio(
            endpoint, w.access_key, w.secret_key, http_client=urllib3.PoolManager(retries=False)
        ).list_buckets()
    with pytest.raises(S3Error) as wrong_key:
        Minio(endpoint, w.access_key, "not-the-key", http_client=trusted).list_buckets()
    assert wrong_key.value.code == "SignatureDoesNotMatch"
    plain = Minio(
        endpoint, w.access_key, w.secret_key, secure=False, http_client=urllib3.PoolManager(retries=False)
    )
    with pytest.raises(InvalidResponseError, match="Client sent an HTTP request to an HTTPS server"):
        plain.list_buckets()


def test_the_storage_secret_is_in_no_status_plan_event_or_log_of_the_cluster(world):
    """Last of the suite: every job above read and wrote its checkpoints with the storage Secret's key
    (mounted as files); that key is in no StreamJob, ConfigMap (the plans), event, pod, Deployment or
    Service, and in no log of a pod still there (the operator's, the coordinators', the bundled
    servers'): only in its Secret."""
    w = world
    kinds = ["streamjobs", "configmaps", "events", "pods", "deployments", "statefulsets", "services"]
    for kind in kinds:
        listed = w.kubectl("get", kind, "--all-namespaces", "-o", "yaml")
        assert w.secret_key not in listed, f"the storage secret key is in the {kind}"
    pods = json.loads(w.kubectl("get", "pods", "--all-namespaces", "-o", "json"))["items"]
    assert pods, "no pod to read the logs of"
    for pod in pods:
        where = ["-n", pod["metadata"]["namespace"], pod["metadata"]["name"]]
        logs = w.kubectl("logs", *where, "--all-containers", "--tail=-1", check=False)
        assert w.secret_key not in logs, f"the storage secret key is in the log of pod {where[-1]}"
    stored = json.loads(w.kubectl("get", "secret", "nopstream-storage", "-o", "json"))["data"]
    assert base64.b64decode(stored["secretKey"]).decode() == w.secret_key  # the key the jobs used
