"""The job on the real nodes (`e2e/cluster.py`): recovery times, start time, the operator's idle CPU.

A two-node cluster of its own (containerd, kubelet, kube-proxy and kube-router's
NetworkPolicy firewall in network namespaces of its own, CoreDNS on node-0), the chart
installed as the e2e suite installs it (bundled etcd and MinIO serving TLS only, etcd with
client certificates and authentication, and the operator, on node-0), and a rolling word
count at parallelism 3 from MinIO to MinIO under STRICT_EXACTLY_ONCE (the e2e job: 16 files of 2,500 lines,
3 ms a line in `split`, checkpoints every 500 ms), whose sink publishes an object per
subtask and epoch as each epoch commits; once as it is, once with `standbyTasks`. It measures, in one run:
  apply -> Running        `kubectl apply` of the StreamJob until its phase is Running
  kill -> new output      a task pod force-deleted (`--grace-period=0 --force`) until the
                          first output object of an epoch of the new run (at or above
                          the first epoch of its restore point in etcd): what a user
                          watching the output waits; three kills per job, each once the
                          job runs again and, with standbyTasks, its standby pods for the
                          next run are ready (target < 5 s); with where the seconds go:
                          the run advanced, its restore point chosen, its tasks registered,
                          its first epoch durable (`recovery_steps`)
  node loss -> new output node-1 lost with task pods on it (every process of the node killed
                          at once, `Cluster.kill_node`) until the first output object of an
                          epoch of the new run, on a third job (target < 30 s); with where
                          the seconds go: node-1 NotReady (the controller manager's grace),
                          then the steps of the recovery as above
  heal -> new output      on a fourth job, a partition (`tests/operator/nemesis.py`: a task
                          pod cut from the job's other pods, the leading coordinator cut from
                          its tasks, then from etcd) held 8 s and healed, until the first
                          output object of an epoch past the durable one at the heal
  operator CPU            CPU time of the active operator's container over a quiet minute
                          (the job finished, nothing to do), as a share of one core
Ratios: each figure over its target, measured in this run. Not a test: no CI timing.
Run: `python bench/cluster.py` (after scripts/install-servers.sh).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import statistics
import tempfile
import time
from pathlib import Path

from minio import Minio

from e2e.cluster import Cluster
from nopstream.checkpoint.restore import RestorePoint
from nopstream.cluster.backend import Backend, StoreUnavailable
from nopstream.cluster.layout import Layout
from tests.operator import nemesis
from tests.operator.test_e2e import BUNDLED_S3, World, own_world, upload_lines, wordcount

EPOCH = re.compile(r"\.(\d{10})\.\w+$")
KILLS = 3
RECOVERY_TARGET_S = 5.0
NODE_LOSS_TARGET_S = 30.0
PARTITION_S = 8.0


def output_epochs(client: Minio, bucket: str, prefix: str) -> set[int]:
    """The epochs of the committed output objects under `prefix`."""
    names = (o.object_name for o in client.list_objects(bucket, prefix=prefix))
    return {int(m.group(1)) for n in names if (m := EPOCH.search(n))}


def until(what: str, check, timeout: float = 300.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(step)
    raise SystemExit(f"timed out waiting for {what}")


def explain(w: World, job: str) -> None:
    """Print what a recovery that never came left behind: the job's status, its pods, its keys in etcd."""
    print(f"{job}: {json.dumps(w.job(job).get('status', {}))}", flush=True)
    print(w.kubectl("get", "pods", "-o", "wide"), flush=True)

    async def keys() -> list[str]:
        backend = w.etcd_backend()
        try:
            return sorted(await backend.get_prefix(Layout("default", job, "main").prefix))
        finally:
            await backend.close()

    print("\n".join(asyncio.run(keys())), flush=True)


def tasks_of(w: World, job: str, run: int, *, standby: bool = False) -> list[str]:
    """The running (and, for standbys, ready) task pods of `run`."""
    return [
        p["metadata"]["name"]
        for p in w.pods(job)
        if p["metadata"]["labels"].get("nopstream.io/run") == str(run)
        and p["status"].get("phase") == "Running"
        and (
            not standby
            or any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
        )
    ]


def _conditions(pod: dict) -> list[dict[str, str]]:
    return [{"type": c["type"], "status": c["status"]} for c in pod["status"].get("conditions", [])]


def standing_by(w: World, job: str, run: int, count: int) -> bool:
    """Whether `count` standby pods of `run` are ready."""
    return len(tasks_of(w, job, run, standby=True)) >= count


def recovery_steps(
    w: World, job: str, client: Minio, bucket: str, run: int, tasks: int, killed: float
) -> dict[str, float]:
    """Seconds from `killed` to each step of the recovery from run `run`, as they were first seen.

    Polled every 50 ms: the run key advanced (the operator's pass), the new run's restore point
    chosen (its coordinator), every task of the run registered (its processes started and
    serving), its first epoch durable, and an output object of that epoch or a later one (the
    sink's commit). A recovery that needed a second run (a node loss can: the run advanced
    again before its coordinator chose a restore point) is followed into it, and "run
    advanced again" says when. Empty when the job finished first; after 300 s, `explain` and
    SystemExit.
    """
    layout = Layout("default", job, "main")

    async def look(backend: Backend, seen: dict[str, float]) -> None:
        """Record the steps seen now."""
        at = time.monotonic() - killed
        entry = await backend.get(layout.run)
        current = 0 if entry is None else int(entry.value)
        if current <= run:
            return
        seen.setdefault("run advanced", at)
        if current > run + 1:
            seen.setdefault("run advanced again", at)
        if len(await backend.get_prefix(layout.tasks(current))) >= tasks:
            seen.setdefault("tasks registered", at)
        restore = await backend.get(layout.restore(current))
        if restore is None:
            return
        first = RestorePoint.from_json(restore.value).next_epoch
        seen.setdefault("restore point", at)
        durable = await backend.get(layout.latest_durable)
        if durable is not None and (json.loads(durable.value).get("epoch") or 0) >= first:
            seen.setdefault("epoch durable", at)
        if max(output_epochs(client, bucket, f"{job}/"), default=0) >= first:
            seen.setdefault("output", time.monotonic() - killed)

    async def watch() -> dict[str, float]:
        backend, seen = w.etcd_backend(), {}
        try:
            polls = 0
            while "output" not in seen:
                polls += 1
                if time.monotonic() - killed > 300:
                    explain(w, job)
                    raise SystemExit(f"timed out waiting for the output of a run after {run}: saw {seen}")
                if polls % 20 == 0 and w.job(job)["status"].get("phase") == "Succeeded":
                    return {}
                with contextlib.suppress(StoreUnavailable):
                    await look(backend, seen)
                await asyncio.sleep(0.05)
            return seen
        finally:
            await backend.close()

    return asyncio.run(watch())


def kill_to_new_output(
    w: World, job: str, client: Minio, bucket: str, rng: random.Random, *, standby: bool
) -> dict[str, float] | None:
    """Seconds from a task pod's force-delete to each step of the recovery, up to the first output
    of an epoch the new run made (`recovery_steps`).

    The kill comes once the job runs again and, with standbyTasks, once the next run's
    standby pods are ready (the state a job with them is in but for a minute after a
    recovery): failures come at any time, most of them long after a start.
    """
    until("Running", lambda: w.job(job)["status"].get("phase") in ("Running", "Succeeded"))
    status = w.job(job)["status"]
    if status.get("phase") != "Running":
        return None
    run = status["run"]
    if standby:  # its steady state: the next run's standby pods started and waiting
        until("the standby pods", lambda: standing_by(w, job, run + 1, len(tasks_of(w, job, run))))
    tasks = tasks_of(w, job, run)
    killed = time.monotonic()
    w.kubectl("delete", "pod", rng.choice(sorted(tasks)), "--grace-period=0", "--force", "--wait=false")
    return recovery_steps(w, job, client, bucket, run, len(tasks), killed) or None


def measure(
    w: World, client: Minio, bucket: str, job: str, *, standby: bool
) -> tuple[float, list[dict[str, float]]]:
    """(apply -> Running, the kills' recovery steps) of one word count job."""
    rng = random.Random(11)
    spec = wordcount(job, bucket, BUNDLED_S3, job, standby=standby)
    spec["spec"]["model"]["operators"][2]["emit"] = "rolling"
    applied = time.monotonic()
    w.kubectl("apply", "-f", "-", input=json.dumps(spec))
    until("Running", lambda: w.job(job).get("status", {}).get("phase") == "Running")
    start_s = time.monotonic() - applied
    until("a first committed output", lambda: output_epochs(client, bucket, f"{job}/"))
    kills = (kill_to_new_output(w, job, client, bucket, rng, standby=standby) for _ in range(KILLS))
    recoveries = [s for s in kills if s is not None]
    until("Succeeded", lambda: w.job(job)["status"].get("phase") == "Succeeded", timeout=600)
    return start_s, recoveries


def node_loss(w: World, client: Minio, bucket: str, job: str) -> dict[str, float]:
    """Seconds from node-1's loss to it NotReady, to the job's next run, to that run's first output."""
    assert w.cluster is not None
    spec = wordcount(job, bucket, BUNDLED_S3, job)
    spec["spec"]["model"]["operators"][2]["emit"] = "rolling"
    w.kubectl("apply", "-f", "-", input=json.dumps(spec))
    until("a first committed output", lambda: output_epochs(client, bucket, f"{job}/"))
    run = w.job(job)["status"]["run"]
    placed = {
        p["spec"].get("nodeName")
        for p in w.pods(job)
        if p["metadata"]["labels"].get("nopstream.io/role") == "task"
    }
    if "node-1" not in placed:
        raise SystemExit(f"no task pod of {job} on node-1 (on {placed})")
    tasks = len(tasks_of(w, job, run))
    lost = time.monotonic()
    w.cluster.kill_node("node-1")
    until("node-1 NotReady", lambda: not w.cluster.node_ready("node-1"), step=0.1)
    since = {"node-1 NotReady": time.monotonic() - lost}
    steps = recovery_steps(w, job, client, bucket, run, tasks, lost)
    if not steps:
        explain(w, job)
        raise SystemExit(f"{job} finished before it recovered from the node loss")
    since |= steps
    w.cluster.restart_node("node-1")
    until("Succeeded", lambda: w.job(job)["status"].get("phase") == "Succeeded", timeout=600)
    return since


def partition_heals(w: World, client: Minio, bucket: str, job: str) -> dict[str, float]:
    """Seconds from each partition's heal to the job's next committed output, by partition kind."""
    spec = wordcount(job, bucket, BUNDLED_S3, job)
    spec["spec"]["model"]["operators"][2]["emit"] = "rolling"
    w.kubectl("apply", "-f", "-", input=json.dumps(spec))
    until("a first committed output", lambda: output_epochs(client, bucket, f"{job}/"))
    rng, since = random.Random(5), {}
    for kind in ("task-cut", "leader-from-tasks", "leader-from-etcd"):
        until("Running", lambda: nemesis.settled(w, job, -1), timeout=240)
        if w.job(job)["status"].get("phase") == "Succeeded":
            break
        _target, heal = nemesis.strike(w, job, kind, rng)
        time.sleep(PARTITION_S)
        healed = time.monotonic()
        heal()
        durable = w.job(job)["status"].get("latestDurableEpoch") or 0
        until(
            "output past the heal",
            lambda d=durable: max(output_epochs(client, bucket, f"{job}/"), default=0) > d,
            timeout=240,
        )
        since[kind] = time.monotonic() - healed
    until("Succeeded", lambda: w.job(job)["status"].get("phase") == "Succeeded", timeout=600)
    return since


def operator_cpu_share(w: World, seconds: float = 60.0) -> float:
    """The active operator container's CPU time over `seconds`, as a share of one core."""
    assert w.cluster is not None
    pids = []
    for pod in json.loads(
        w.kubectl("get", "pods", "-l", "app.kubernetes.io/component=operator", "-o", "json")
    )["items"]:
        pids.append(w.cluster.container_pid(pod["status"]["containerStatuses"][0]["containerID"]))

    def usage(pid: int) -> int:
        line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ":cpuacct" in x)
        path = line.split(":", 2)[2]
        return int(Path(f"/sys/fs/cgroup/cpuacct{path}/cpuacct.usage").read_text())

    before = {pid: usage(pid) for pid in pids}
    time.sleep(seconds)
    return max(usage(pid) - before[pid] for pid in pids) / 1e9 / seconds  # the active one uses the most


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, Cluster.start(Path(tmp) / "kube") as cluster:
        w = own_world(cluster, Path(tmp))
        client = w.s3_client()
        bucket = "bench-cluster"
        client.make_bucket(bucket)
        upload_lines(client, bucket, random.Random(11), files=16, lines=2500, words=8)
        for label, job, standby in (("as it is", "bench", False), ("standbyTasks", "bench-standby", True)):
            _print_kills(label, *measure(w, client, bucket, job, standby=standby))
        _print_node_loss(node_loss(w, client, bucket, "bench-node"))
        print(f"[partitions held {PARTITION_S:g} s]")
        for kind, s in partition_heals(w, client, bucket, "bench-cut").items():
            print(f"{kind:<18} heal -> new output {s:6.1f} s", flush=True)
        cpu = operator_cpu_share(w)
        print(f"operator CPU, quiet minute {cpu * 100:6.2f} % of one core (four jobs finished)")


def _print_kills(label: str, start_s: float, recoveries: list[dict[str, float]]) -> None:
    print(f"[{label}]")
    print(f"apply -> Running           {start_s:6.1f} s")
    for i, steps in enumerate(recoveries, 1):
        print(f"kill {i} -> new output       {steps['output']:6.1f} s   ({_steps(steps)})")
    if recoveries:
        median = statistics.median(steps["output"] for steps in recoveries)
        verdict = "met" if median < RECOVERY_TARGET_S else "NOT met"
        print(
            f"kill -> new output, median {median:6.1f} s   ratio {median / RECOVERY_TARGET_S:.2f}"
            f" (target < {RECOVERY_TARGET_S:g} s: {verdict})",
            flush=True,
        )


def _print_node_loss(lost: dict[str, float]) -> None:
    s = lost["output"]
    verdict = "met" if s < NODE_LOSS_TARGET_S else "NOT met"
    print("[node loss]")
    print(f"node-1 lost -> new output  {s:6.1f} s   ({_steps(lost)})")
    print(
        f"node loss -> new output  ratio {s / NODE_LOSS_TARGET_S:.2f}"
        f" (target < {NODE_LOSS_TARGET_S:g} s: {verdict})",
        flush=True,
    )


def _steps(steps: dict[str, float]) -> str:
    """The steps of a recovery up to its output, in the order they were seen."""
    return ", ".join(
        f"{what} {s:.1f}" for what, s in sorted(steps.items(), key=lambda i: i[1]) if what != "output"
    )


if __name__ == "__main__":
    main()
