"""The e2e nemesis: seeded faults of the shapes a real cluster has, each bounded in time, then healed.

Jepsen's fault set on the suite's own cluster (`e2e/cluster.py`): partitions by iptables
rules in the nodes' namespaces (a task pod from the job's other pods; the leading
coordinator from etcd; the leading coordinator from the job's tasks), the worker node cut
off the nodes' bridge (node-0 with the control plane, etcd and MinIO from node-1: a
majority from a minority; past the controller manager's 12 s grace node-1 is lost and
its pods replaced while they still run), and pauses (SIGSTOP) of the leading
coordinator and of a task, at random moments of a job that checkpoints every 500 ms, so
mostly inside an epoch's alignment or commit (not at a chosen step: that is what the
fault points of `nopstream chaos` do). Every kind comes once, in a seeded order, then
seeded kinds until `count`; each fault begins once the job runs again and an epoch
later than the last heal is durable.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nopstream.local import kills

if TYPE_CHECKING:
    from tests.operator.test_e2e import World

KINDS = ("task-cut", "leader-from-etcd", "leader-from-tasks", "node-cut", "leader-paused", "task-paused")
WORKER = "node-1"


@dataclass(frozen=True)
class Fault:
    """One fault as it was made: its kind, what it struck, how long it lasted, and how long after
    its heal the job ran with a new durable epoch."""

    kind: str
    target: str
    seconds: float
    settled_s: float


def plan(rng: random.Random, count: int) -> list[tuple[str, float]]:
    """The kinds and durations of `count` faults: every kind once (seeded order), then seeded kinds."""
    kinds = list(KINDS)
    rng.shuffle(kinds)
    kinds += [rng.choice(KINDS) for _ in range(count - len(kinds))]
    # a node cut outlasts the 12 s grace about half the time: then its pods are replaced; the
    # others outlast the pods' 6 s lease TTL about half the time: then a cut leader is deposed
    return [(k, rng.uniform(4.0, 20.0) if k == "node-cut" else rng.uniform(2.0, 9.0)) for k in kinds]


def _pod(w: World, name: str) -> dict[str, Any]:
    return json.loads(w.kubectl("get", "pod", name, "-o", "json"))


def _running(w: World, job: str, role: str) -> list[dict[str, Any]]:
    run = str(w.job(job)["status"]["run"])
    return [
        p
        for p in w.pods(job)
        if p["metadata"]["labels"].get("nopstream.io/role") == role
        and (role != "task" or p["metadata"]["labels"].get("nopstream.io/run") == run)
        and p["status"].get("phase") == "Running"
        and p["status"].get("podIP")
    ]


def pause(w: World, pod: dict[str, Any]) -> Callable[[], None]:
    """SIGSTOP the pod's processes (a task pod's first process, then the task process it forked); the
    heal continues them (gone by then: killed by the liveness probe)."""
    pid = w.container_pid(pod["metadata"]["name"])
    os.kill(pid, signal.SIGSTOP)
    stopped = [pid, *kills.children(pid)]
    for child in stopped[1:]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGSTOP)

    def heal() -> None:
        for each in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGCONT)

    return heal


def strike(w: World, job: str, kind: str, rng: random.Random) -> tuple[str, Callable[[], None]]:
    """Make one fault of `kind` on `job` now: (what it struck, how to heal it)."""
    assert w.cluster is not None
    cluster = w.cluster
    tasks = _running(w, job, "task")
    if kind == "node-cut":
        return WORKER, cluster.isolate_node(WORKER).heal
    if kind in ("task-cut", "task-paused"):
        task = rng.choice(tasks)
        if kind == "task-paused":
            return task["metadata"]["name"], pause(w, task)
        others = [
            p["status"]["podIP"] for p in w.pods(job) if p["metadata"]["name"] != task["metadata"]["name"]
        ]
        return task["metadata"]["name"], cluster.cut([task["status"]["podIP"]], others).heal
    # a running job names no leader for the moment between a lease lost and the next one taken
    named = w.wait("a leader", lambda: w.job(job)["status"].get("leader"), timeout=60)
    leader = _pod(w, named["pod"])
    name = leader["metadata"]["name"]
    if kind == "leader-paused":
        return name, pause(w, leader)
    if kind == "leader-from-etcd":
        etcd = w.kubectl(
            "get", "pods", "-l", "app.kubernetes.io/component=etcd", "-o", "jsonpath={.items[0].status.podIP}"
        )
        return name, cluster.cut([leader["status"]["podIP"]], [etcd]).heal
    assert kind == "leader-from-tasks", kind
    return name, cluster.cut([leader["status"]["podIP"]], [t["status"]["podIP"] for t in tasks]).heal


def settled(w: World, job: str, after_epoch: int) -> bool:
    """Whether the job is over, or runs with an epoch past `after_epoch` durable and both nodes Ready."""
    assert w.cluster is not None
    status = w.job(job)["status"]
    if status.get("phase") == "Succeeded":
        return True
    return (
        status.get("phase") == "Running"
        and (status.get("latestDurableEpoch") or 0) > after_epoch
        and all(w.cluster.node_ready(n.spec.name) for n in w.cluster.nodes)
    )


def unleash(w: World, job: str, rng: random.Random, count: int) -> list[Fault]:
    """`count` faults on the running `job`, one after another, each healed before the next."""
    made: list[Fault] = []
    for kind, seconds in plan(rng, count):
        w.wait("the job settled", lambda: settled(w, job, -1), timeout=240)
        if w.job(job)["status"].get("phase") == "Succeeded":
            break
        target, heal = strike(w, job, kind, rng)
        try:
            time.sleep(seconds)
        finally:
            heal()
        healed = time.monotonic()
        epoch = w.job(job)["status"].get("latestDurableEpoch") or 0
        w.wait(f"the job settled after {kind} on {target}", lambda e=epoch: settled(w, job, e), timeout=240)
        made.append(Fault(kind, target, round(seconds, 1), round(time.monotonic() - healed, 1)))
    return made
