"""End to end on a real Kubernetes API server: helm install, StreamJobs, pod kills, refusals, quiet passes.

The control plane and the process node agent come from `e2e/` (pods run as local
processes of this checkout; the image is not used). etcd and MinIO are real servers
started here. The job: a word count at parallelism 3 from MinIO to MinIO, strict
exactly-once; its output is compared, as an exact multiset, with the output of the
same model run on the embedded default (`nopstream run`) without faults.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from e2e import servers
from e2e.agent import KILL_ANNOTATION
from e2e.cluster import Cluster
from tests.conftest import ROOT

FNS = """
import time

def split(line):
    time.sleep(0.003)
    return line.split()

def word(w):
    return w

def first_letter(w):
    return w[:1]
"""
OPERATOR_USER = "system:serviceaccount:default:nopstream-operator"


@dataclass
class World:
    """The cluster, the servers and the helpers one test module shares."""

    cluster: Cluster
    etcd: servers.Etcd
    minio: object
    workdir: Path

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return self.cluster.kubectl(*args, check=check, input=input).stdout

    def job(self, name: str) -> dict:
        return json.loads(self.kubectl("get", "streamjob", name, "-o", "json"))

    def wait(self, what: str, check, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}; operator log:\n{self.operator_log()}")

    def operator_log(self) -> str:
        logs = sorted((self.cluster.workdir / "agent").glob("*/pods/*operator*/operator.log"))
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)

    def pods(self, job: str) -> list[dict]:
        out = self.kubectl("get", "pods", "-l", f"nopstream.io/job={job}", "-o", "json")
        return json.loads(out)["items"]


@pytest.fixture(scope="module")
def world(tmp_path_factory, minio_server):
    workdir = tmp_path_factory.mktemp("e2e")
    (workdir / "e2efns.py").write_text(FNS)
    etcd = servers.start_etcd(workdir / "etcd")
    try:
        with Cluster.start(workdir / "kube") as cluster:
            cluster.start_agent("agent-0", cwd=workdir)
            w = World(cluster, etcd, minio_server, workdir)
            install_chart(w)
            yield w
    finally:
        etcd.stop()


def install_chart(w: World) -> None:
    path = os.pathsep.join([str(ROOT), str(ROOT / "operator"), str(w.workdir)])
    values = {
        "operator": {
            "replicas": 2,  # kopf peering: one replica acts, the other waits
            "command": ["python", "-m", "nopstream", "operator"],
            "extraEnv": {"PYTHONPATH": path},
        },
        "pods": {
            "command": ["python", "-m", "nopstream"],
            "extraEnv": {"PYTHONPATH": path},
            "leaseTtlSeconds": 4,
        },
        "etcd": {"endpoint": "{}:{}".format(*w.etcd.endpoint)},
        "storageSecret": {
            "create": True,
            "accessKey": w.minio.access_key,
            "secretKey": w.minio.secret_key,
        },
    }
    (w.workdir / "values.yaml").write_text(yaml.safe_dump(values))
    env = {
        **os.environ,
        "KUBECONFIG": str(w.cluster.kubeconfig),
        "HELM_CACHE_HOME": str(w.workdir / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(w.workdir / "helm" / "config"),
        "HELM_DATA_HOME": str(w.workdir / "helm" / "data"),
    }
    subprocess.run(
        [
            servers.binary("helm"),
            "install",
            "nopstream",
            str(ROOT / "charts" / "nopstream"),
            "--namespace",
            "default",
            "-f",
            str(w.workdir / "values.yaml"),
            "--wait",
            "--timeout",
            "120s",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    w.wait(
        "both operator pods running",
        lambda: (
            w.kubectl(
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/component=operator",
                "-o",
                "jsonpath={.items[*].status.phase}",
                check=False,
            )
            == "Running Running"
        ),
    )


def wordcount(
    name: str, bucket: str, minio_url: str, out: str, *, key_fn: str = "e2efns:word", parallelism: int = 3
) -> dict:
    return {
        "apiVersion": "nopstream.io/v1alpha1",
        "kind": "StreamJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "semanticMode": "STRICT_EXACTLY_ONCE",
            "parallelism": parallelism,
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


def clean_output(w: World, client, bucket: str, model: dict) -> Counter[str]:
    """The output of `model` run on the embedded default (no cluster, no faults)."""
    name = model["metadata"]["name"]
    (w.workdir / f"{name}.yaml").write_text(yaml.safe_dump(model))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(w.workdir)]),
        "NOPSTREAM_S3_ACCESS_KEY": w.minio.access_key,
        "NOPSTREAM_S3_SECRET_KEY": w.minio.secret_key,
    }
    done = subprocess.run(
        [sys.executable, "-m", "nopstream", "run", f"{name}.yaml", "--quiet", "--workdir", f"run-{name}"],
        cwd=w.workdir, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out_prefix = model["spec"]["model"]["sinks"][0]["config"]["prefix"]
    return objects(client, bucket, out_prefix)


def objects(client, bucket: str, prefix: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for obj in client.list_objects(bucket, prefix=prefix):
        body = client.get_object(bucket, obj.object_name)
        try:
            out.update(json.dumps(json.loads(line), sort_keys=True) for line in body.read().splitlines())
        finally:
            body.close()
            body.release_conn()
    return out


def leader(w: World, job: str) -> str:
    from nopstream.cluster.election import Election
    from nopstream.cluster.etcd import EtcdBackend
    from nopstream.cluster.layout import Layout

    async def read() -> str:
        backend = EtcdBackend(*w.etcd.endpoint)
        try:
            found = await Election(backend, Layout("default", job, "main"), "test").leader()
            assert found is not None, "no coordinator leads"
            return found[0]
        finally:
            await backend.close()

    return asyncio.run(read())


def kill_tasks(w: World, rng: random.Random, count: int, *, first_nonce: int) -> int:
    """Kill `count` task pods of the current run one after the other, each after the job runs again."""
    done = 0
    for nonce in range(first_nonce, first_nonce + count):
        status = w.job("wordcount")["status"]
        if status.get("phase") == "Succeeded":
            break
        run = status["run"]
        tasks = [
            p["metadata"]["name"]
            for p in w.pods("wordcount")
            if p["metadata"]["labels"].get("nopstream.io/run") == str(run)
            and p["status"].get("phase") == "Running"
        ]
        kill(w, rng.choice(sorted(tasks)), nonce)
        done += 1
        w.wait(f"run {run + 1}", lambda run=run: w.job("wordcount")["status"]["run"] > run)
        w.wait("Running again", lambda: w.job("wordcount")["status"].get("phase") in ("Running", "Succeeded"))
    return done


def kill(w: World, pod: str, nonce: int) -> None:
    w.kubectl("annotate", "pod", pod, "--overwrite", f"{KILL_ANNOTATION}=KILL:{nonce}")


def operator_writes(w: World) -> list[dict]:
    """The operator's writes to the API, but for kopf's peering keep-alives."""
    return [
        e
        for e in w.cluster.audit_writes()
        if e.get("user", {}).get("username") == OPERATOR_USER
        and e.get("objectRef", {}).get("resource") != "clusterkopfpeerings"
    ]


def test_wordcount_survives_pod_kills_refuses_a_key_change_and_settles(world, minio_client, bucket):
    w = world
    rng = random.Random(17)
    upload_lines(minio_client, bucket, rng, files=16, lines=2500, words=8)
    # the failure-free output, on the embedded default
    expected = clean_output(w, minio_client, bucket, wordcount("wc-clean", bucket, w.minio.url, "clean"))
    assert sum(expected.values()) == 16 * 2500 * 8

    job = wordcount("wordcount", bucket, w.minio.url, "faulty")
    w.kubectl("apply", "-f", "-", input=json.dumps(job))
    w.wait("Running", lambda: w.job("wordcount").get("status", {}).get("phase") == "Running")
    table = w.kubectl("get", "streamjobs")
    assert table.split("\n")[0].split() == ["NAME", "PHASE", "RUN", "MODE", "DURABLE", "AGE"]
    assert table.split("\n")[1].split()[:4] == ["wordcount", "Running", "1", "STRICT_EXACTLY_ONCE"]
    tasks = [p for p in w.pods("wordcount") if p["metadata"]["labels"]["nopstream.io/role"] == "task"]
    assert len(tasks) == w.job("wordcount")["status"]["tasksTotal"] == 6  # lines+split, count+out: 3 each

    # a keyed operator's key selector changes: refused, and the job keeps running as it was
    changed = wordcount("wordcount", bucket, w.minio.url, "faulty", key_fn="e2efns:first_letter")
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
    kills = kill_tasks(w, rng, 2, first_nonce=1)
    fingerprint = w.job("wordcount")["status"]["planFingerprint"]
    rescaled = wordcount("wordcount", bucket, w.minio.url, "faulty", parallelism=4)
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
    kill(w, coordinator, 99)
    w.wait("Succeeded", lambda: w.job("wordcount")["status"].get("phase") == "Succeeded", timeout=400)
    status = w.job("wordcount")["status"]
    assert kills == 5, "the job ended before five kills"
    # one run per recovery, one for the rescale; none for the coordinator
    assert status["recoveries"] == 5 and status["run"] == 7 == run_before
    got = objects(minio_client, bucket, "faulty/")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=wordcount", "-o", "json")
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"Recovery", "Upgrade", "Savepoint", "Upgraded", "Succeeded", "SpecChangeRefused"} <= reasons

    # passes over the finished, unchanged job write nothing
    before = len(operator_writes(w))
    time.sleep(6)
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


def test_a_savepoint_on_request_then_suspend_and_resume(world, minio_client, bucket):
    w = world
    upload_lines(minio_client, bucket, random.Random(5), files=8, lines=2000, words=6)
    expected = clean_output(
        w, minio_client, bucket, wordcount("pause-clean", bucket, w.minio.url, "clean", parallelism=2)
    )
    job = wordcount("pausable", bucket, w.minio.url, "paused", parallelism=2)
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
    w.wait("Succeeded", lambda: w.job("pausable")["status"].get("phase") == "Succeeded", timeout=300)
    status = w.job("pausable")["status"]
    assert status["run"] == run + 1 and status["recoveries"] == 0
    got = objects(minio_client, bucket, "paused/")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
    events = w.kubectl("get", "events", "--field-selector", "involvedObject.name=pausable", "-o", "json")
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"SavepointRequested", "Savepoint", "Suspend", "Suspended", "Resumed", "Succeeded"} <= reasons

    # deleting the StreamJob removes its pods and plan ConfigMaps behind the finalizer; checkpoints stay
    assert "nopstream.io/finalizer" in w.job("pausable")["metadata"]["finalizers"]
    checkpoints = sorted(
        o.object_name for o in minio_client.list_objects(bucket, prefix="cp-paused/", recursive=True)
    )
    assert checkpoints
    w.kubectl("delete", "streamjob", "pausable", "--wait=true", "--timeout=60s")
    w.wait("the pods gone", lambda: w.pods("pausable") == [])
    assert w.kubectl("get", "configmaps", "-l", "nopstream.io/job=pausable", "-o", "name") == ""
    after = sorted(
        o.object_name for o in minio_client.list_objects(bucket, prefix="cp-paused/", recursive=True)
    )
    assert after == checkpoints
