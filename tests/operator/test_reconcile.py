"""`reconcile_once`, one phase at a time, against fakes of its two adapters.

The fakes stand in for the Kubernetes API (`Kube`: objects in dicts, pods whose phase
the test sets) and the operator's view of etcd (`EtcdView`: a run counter and an epoch
list). They are fakes by design: what a pass decides is tested here in milliseconds,
and the same passes run against a real API server, etcd and pods in `test_e2e.py`.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from nopstream_operator.claims import Holder, claim_key
from nopstream_operator.decide import REPORT_GRACE_S, Lost, Refused, RunPods, Whole, decide_pods
from nopstream_operator.health import now_ms, rfc3339
from nopstream_operator.kube import JobInEtcd, NameTaken
from nopstream_operator.observed import Context, compiled, deployed_plans, observe
from nopstream_operator.reconcile import reconcile_once
from nopstream_operator.resources import PodSettings

from nopstream.checkpoint.restore import RestoreRequest
from nopstream.cluster.epochlog import EpochEntry
from nopstream.cluster.registry import FailureReport
from nopstream.plan.epochs import EpochState
from tests.conftest import EXAMPLES

JOB = yaml.safe_load((EXAMPLES / "wordcount.yaml").read_text())
JOB["metadata"] = {**JOB["metadata"], "namespace": "prod", "uid": "u-1", "generation": 1}
JOB["spec"]["checkpoint"]["storage"] = {"s3": {"endpoint": "http://s3:9000", "bucket": "checkpoints"}}
NAME = JOB["metadata"]["name"]


class FakeKube:
    """The API objects of one namespace, in dicts; every write counted."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.streamjob = copy.deepcopy(job)
        self.others: dict[tuple[str, str], dict[str, Any]] = {}  # StreamJobs of other namespaces
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.log: list[str] = []  # every write, in order

    @property
    def writes(self) -> int:
        """How many writes were made (`Kube.writes`)."""
        return len(self.log)

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        if (namespace, name) in self.others:
            return copy.deepcopy(self.others[(namespace, name)])
        meta = self.streamjob["metadata"]
        return (
            copy.deepcopy(self.streamjob) if (namespace, name) == (meta["namespace"], meta["name"]) else None
        )

    def pods(self, namespace: str, job_id: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (kind, _), o in sorted(self.objects.items()) if kind == "Pod"]

    def exists(self, kind: str, namespace: str, name: str) -> bool:
        return (kind, name) in self.objects

    def configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        found = self.objects.get(("ConfigMap", name))
        return None if found is None else dict(found["data"])

    def owned_secret(self, namespace: str, name: str, owner_uid: str) -> dict[str, bytes] | None:
        found = self.objects.get(("Secret", name))
        if found is None:
            return None
        if owner_uid not in {o["uid"] for o in found["metadata"].get("ownerReferences", [])}:
            raise NameTaken(f"Secret {namespace}/{name} exists and is not this job's")
        return {key: value.encode() for key, value in found["stringData"].items()}

    def create(self, manifest: dict[str, Any]) -> None:
        """Create an object; one of this name already there is kept as it is (the API's 409, adopted)."""
        self.log.append(f"create {manifest['kind']} {manifest['metadata']['name']}")
        self.objects.setdefault((manifest["kind"], manifest["metadata"]["name"]), copy.deepcopy(manifest))

    def delete_pod(self, namespace: str, name: str, *, grace: int = 5) -> None:
        self.log.append(f"delete Pod {name}")
        self.objects.pop(("Pod", name), None)

    def label_pod(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        self.log.append(f"label Pod {name} {labels}")
        held = self.objects[("Pod", name)]["metadata"]["labels"]
        for key, value in labels.items():  # a merge patch: null removes
            if value is None:
                held.pop(key, None)
            else:
                held[key] = value

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.log.append("patch status")
        held = dict(self.streamjob.get("status") or {})
        for key, value in status.items():  # a JSON merge patch: null removes
            if value is None:
                held.pop(key, None)
            else:
                held[key] = value
        self.streamjob["status"] = held

    def set_pods(
        self,
        role: str,
        phase: str,
        *,
        ready: bool = True,
        exit_code: int | None = None,
        log: str = "",
        names: set[str] | None = None,
    ):
        """Give every pod of a role (or of those `names`) a phase, as a kubelet would report it."""
        for (kind, name), pod in self.objects.items():
            if kind != "Pod" or pod["metadata"]["labels"]["nopstream.io/role"] != role:
                continue
            if names is not None and name not in names:
                continue
            state = {"terminated": {"exitCode": exit_code, "message": log}} if exit_code is not None else {}
            pod["status"] = {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                "containerStatuses": [{"state": state}],
            }

    def place(self, node: str, names: set[str], *, deleting: bool = False) -> None:
        """Bind pods `names` to `node` (and mark them being deleted, as an eviction would)."""
        for name in names:
            pod = self.objects[("Pod", name)]
            pod["spec"]["nodeName"] = node
            if deleting:
                pod["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"


class FakeEtcd:
    """The job's run counter, epoch log summary and restore requests."""

    def __init__(self) -> None:
        self.current_run = 0
        self.durable: int | None = None
        self.durable_at: int | None = None  # ms
        self.committed_at: int | None = None  # ms: when the durable epoch (also the committed) was
        self.leader: tuple[str, int] | None = None
        self.requests: dict[int, RestoreRequest] = {}
        self.servings: dict[int, dict[str, str] | None] = {}
        self.failed: dict[str, FailureReport] = {}  # the current run's failure reports
        self.claims: dict[str, bytes] = {}

    def hold(self, key: str, value: bytes) -> bytes:
        return self.claims.setdefault(key, value)

    def replace(self, key: str, expected: bytes, value: bytes) -> bool:
        if self.claims.get(key) != expected:
            return False
        self.claims[key] = value
        return True

    def run(self, layout: Any) -> int:
        return self.current_run

    def advance_run(
        self,
        layout: Any,
        expected: int,
        *,
        serving: Mapping[str, str] | None = None,
        restore: RestoreRequest | None = None,
    ) -> int:
        if self.current_run <= expected:  # a run behind `expected` is lost state: written past it
            self.current_run = expected + 1
            self.servings[self.current_run] = None if serving is None else dict(serving)
            self.failed = {}
            if restore is not None:  # in the run's transaction: only with the run it is for
                self.requests[self.current_run] = restore
        return self.current_run

    def observe(self, layout: Any) -> JobInEtcd:
        entries = ()
        if self.durable is not None:  # the durable epoch, committed too
            entries = (EpochEntry(self.durable, EpochState.COMMITTED, 1, "c", at=self.committed_at),)
        serving = self.servings.get(self.current_run)
        return JobInEtcd(
            self.current_run,
            entries,
            self.durable,
            self.durable_at,
            self.leader,
            serving=serving,
            failed=self.failed,
        )

    def serving(self, layout: Any, run: int) -> dict[str, str] | None:
        return self.servings.get(run)


@pytest.fixture
def world():
    kube, etcd = FakeKube(JOB), FakeEtcd()
    events: list[tuple[str, str]] = []
    ctx = Context(
        kube=kube,  # type: ignore[arg-type]
        etcd=etcd,  # type: ignore[arg-type]
        pods=PodSettings(etcd="etcd:2379", operator_namespace="nopstream-system"),
        emit=lambda job, kind, reason, message: events.append((reason, message)),
    )
    return ctx, kube, etcd, events


def passes(ctx: Context, n: int = 1) -> None:
    for _ in range(n):
        reconcile_once(ctx, "prod", NAME)


def status(kube: FakeKube) -> dict[str, Any]:
    return kube.streamjob.get("status") or {}


def kinds(kube: FakeKube) -> list[str]:
    return sorted(f"{k} {n}" for k, n in kube.objects)


def test_a_first_pass_records_the_run_and_plan_before_any_pod_then_the_pods_follow(world):
    ctx, kube, etcd, events = world
    passes(ctx)
    assert (status(kube)["phase"], status(kube)["run"], etcd.current_run) == ("Pending", 1, 1)
    assert [k.split()[0] for k in kinds(kube)] == ["ConfigMap"]  # the plan, no pod yet
    passes(ctx)
    pods = [k for k in kinds(kube) if k.startswith("Pod")]
    assert len(pods) == 2 + status(kube)["tasksTotal"]  # two coordinators and the tasks
    assert "Secret wordcount-secret" in kinds(kube) and "NetworkPolicy wordcount-peers" in kinds(kube)
    first = kube.log.index("create Secret wordcount-secret")
    assert all(w.startswith(("create Secret", "create NetworkPolicy")) for w in kube.log[first : first + 2])
    assert all(not w.startswith("create Pod") for w in kube.log[:first])  # fences before any pod
    assert status(kube)["deployedRun"] == 1 and events[0][0] == "Deploying"


def test_ready_pods_make_the_job_running_and_a_settled_pass_writes_nothing(world):
    ctx, kube, etcd, _events = world
    passes(ctx, 2)
    kube.set_pods("task", "Running")
    kube.set_pods("coordinator", "Running")
    etcd.durable = 4
    passes(ctx)
    got = status(kube)
    assert (got["phase"], got["tasksReady"], got["latestDurableEpoch"]) == ("Running", got["tasksTotal"], 4)
    ready = next(c for c in got["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "AllTasksReady")
    before = list(kube.log)
    passes(ctx, 3)
    assert kube.log == before


def test_a_pass_finds_the_job_settled_once_it_has_ended_and_the_pass_wrote_nothing(world):
    """Its daemon then passes every SETTLED_PASS_SECONDS; a new spec or a lost pod wakes it at once."""
    ctx, kube, _etcd, _events = world

    def settled_and_wrote() -> tuple[bool, bool]:
        before = kube.writes
        return reconcile_once(ctx, "prod", NAME), kube.writes > before

    passes(ctx, 2)
    kube.set_pods("task", "Running")
    kube.set_pods("coordinator", "Running")
    assert [settled_and_wrote()[0] for _ in range(3)] == [False, False, False]  # running, settled or not
    kube.set_pods("task", "Succeeded", ready=False, exit_code=0)
    kube.set_pods("coordinator", "Succeeded", ready=False, exit_code=0)
    seen = [settled_and_wrote() for _ in range(4)]
    assert seen[0] == (False, True) and status(kube)["phase"] == "Succeeded"  # the pass that ended it
    assert seen[-2:] == [(True, False), (True, False)], seen
    kube.streamjob["spec"]["restartNonce"] = "again"
    assert settled_and_wrote() == (False, True)  # a restart: a new run, written


def test_only_the_leading_coordinator_pod_is_the_leader_services_endpoint(world):
    ctx, kube, etcd, _events = world
    passes(ctx, 2)
    service = kube.objects[("Service", "wordcount-leader")]
    assert service["spec"]["selector"] == {
        "nopstream.io/job": "wordcount",
        "nopstream.io/role": "coordinator",
        "nopstream.io/leader": "true",
    }
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 7700, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["metadata"]["ownerReferences"][0]["kind"] == "StreamJob"
    kube.set_pods("task", "Running")
    kube.set_pods("coordinator", "Running")

    def leaders() -> list[str]:
        pods = [o for (kind, _), o in sorted(kube.objects.items()) if kind == "Pod"]
        return [p["metadata"]["name"] for p in pods if p["metadata"]["labels"].get("nopstream.io/leader")]

    passes(ctx)
    assert leaders() == []  # no leader elected yet
    etcd.leader = ("wordcount-coordinator-1", 3)
    passes(ctx)
    assert leaders() == ["wordcount-coordinator-1"]
    etcd.leader = ("wordcount-coordinator-0", 4)  # a failover
    passes(ctx)
    assert leaders() == ["wordcount-coordinator-0"]
    before = list(kube.log)
    passes(ctx, 2)
    assert kube.log == before  # labelled once, not at every pass


def test_a_failed_task_pod_is_a_global_recovery_recorded_before_its_pods_go(world):
    ctx, kube, etcd, events = world
    passes(ctx, 2)
    kube.set_pods("coordinator", "Running")
    kube.set_pods("task", "Failed", ready=False, exit_code=1, log="Traceback ...\nValueError: boom")
    before = len(kube.log)
    passes(ctx)
    got = status(kube)
    assert (got["phase"], got["run"], got["recoveries"], etcd.current_run) == ("Recovering", 2, 1, 2)
    writes = kube.log[before:]
    deletes = [w for w in writes if w.startswith("delete Pod")]
    creates = [w for w in writes if w.startswith("create Pod")]
    # the status first, then the old run's pods go, then the new run's come, in the same pass
    assert writes == ["patch status", *deletes, *creates] and deletes
    assert creates and all(w.endswith("-r2") for w in creates)
    assert [r for r, _ in events].count("Recovery") == 1
    assert all(n.endswith("-r2") for k, n in kube.objects if k == "Pod" and "coordinator" not in n)
    # the failure's last line (the error, with the user's file and line) is in the condition and event
    (message,) = [m for r, m in events if r == "Recovery"]
    assert message.endswith("-r1 failed: ValueError: boom (run 1 -> 2): restoring the latest durable epoch")


def test_a_task_lost_after_the_coordinators_completed_gets_its_recovery_led_by_new_ones(world):
    # The coordinators saw the final epoch committed and exited 0 (Succeeded, not restarted);
    # a task pod is lost before it published: the new run must have coordinators again.
    ctx, kube, etcd, _events = world
    passes(ctx, 2)
    kube.set_pods("coordinator", "Succeeded", ready=False, exit_code=0)
    kube.set_pods("task", "Failed", ready=False, exit_code=137)
    coordinators = sorted(n for k, n in kube.objects if k == "Pod" and "coordinator" in n)
    passes(ctx)
    assert (status(kube)["phase"], etcd.current_run) == ("Recovering", 2)
    assert all(f"delete Pod {n}" in kube.log for n in coordinators)
    passes(ctx)
    assert sorted(n for k, n in kube.objects if k == "Pod" and "coordinator" in n) == coordinators
    assert all(kube.objects[("Pod", n)].get("status") is None for n in coordinators)  # new pods


def test_pods_on_a_lost_node_go_at_once_a_task_by_a_recovery_and_a_coordinator_by_itself(world):
    ctx, kube, etcd, events = world
    passes(ctx, 2)
    kube.set_pods("coordinator", "Running")
    kube.set_pods("task", "Running")
    tasks = sorted(task_pods(kube, 1))
    coordinators = sorted(n for k, n in kube.objects if k == "Pod" and "coordinator" in n)
    kube.place("node-0", {*tasks[1:], coordinators[1]})
    kube.place("node-1", {tasks[0], coordinators[0]})
    passes(ctx)
    assert (status(kube)["phase"], etcd.current_run) == ("Running", 1)  # node-1 is not lost yet
    ctx.lost_nodes = lambda: frozenset({"node-1"})
    # an eviction began on node-1, but its kubelet is gone: the pod would stay Terminating for ever
    kube.place("node-1", {tasks[0]}, deleting=True)
    before = len(kube.log)
    passes(ctx)
    assert (status(kube)["phase"], status(kube)["run"], etcd.current_run) == ("Recovering", 2, 2)
    writes = kube.log[before:]
    assert f"delete Pod {coordinators[0]}" in writes and f"delete Pod {tasks[0]}" in writes
    assert f"delete Pod {coordinators[1]}" not in writes  # on node-0: it leads meanwhile
    (message,) = [m for r, m in events if r == "Recovery"]
    assert message.startswith(f"{tasks[0]} (its node node-1 is lost) failed (run 1 -> 2)")
    passes(ctx)
    assert kube.objects[("Pod", coordinators[0])].get("status") is None  # made again, to be scheduled


def test_a_standby_on_a_lost_node_is_replaced_not_adopted(world):
    ctx, kube, etcd, _events = world
    standbys = running_with_standbys(ctx, kube)
    far = sorted(standbys)[0]
    kube.set_pods("task", "Running")
    kube.place("node-1", {far})
    ctx.lost_nodes = lambda: frozenset({"node-1"})
    before = len(kube.log)
    passes(ctx)
    assert etcd.current_run == 1  # no pod of the run on it: no recovery
    assert kube.log[before:] == [f"delete Pod {far}", f"create Pod {far}"]  # made anew, in one pass
    made = kube.objects[("Pod", far)]
    assert made.get("status") is None and made["metadata"]["labels"]["nopstream.io/standby"] == "true"


def test_past_its_recoveries_the_job_fails_and_its_pods_go(world):
    ctx, kube, _etcd, _events = world
    kube.streamjob["spec"]["maxRecoveries"] = 1
    passes(ctx, 2)
    for _ in range(2):
        kube.set_pods("task", "Failed", ready=False, exit_code=1)
        passes(ctx, 2)
    got = status(kube)
    ready = next(c for c in got["conditions"] if c["type"] == "Ready")
    assert (got["phase"], got["recoveries"], ready["reason"]) == ("Failed", 1, "TooManyRecoveries")
    rate = "2 failures within 600 s; the limit is 1, after 1 recoveries"
    assert ready["message"].endswith(f"failed ({rate}): the job has failed")
    assert len(got["failedAt"]) == 1  # the failure it recovered from, in the window
    assert not [k for k in kinds(kube) if k.startswith("Pod")]


@pytest.mark.parametrize(
    ("code", "said", "reason"),
    [
        (
            5,
            "nopstream task: cannot start: kafka sink 'out': topic 'x' does not exist on k:9092"
            " (create it first)",
            "CannotStart",
        ),
        (
            6,  # a bad record: the same in every run
            "nopstream task: bad input: split 'in/a.txt#0' of 'in/a.txt': the line at byte 9 is not JSON",
            "BadInput",
        ),
    ],
    ids=["refused-start", "bad-record"],
)
def test_a_refusal_fails_the_job_at_once_with_the_reason(world, code, said, reason):
    ctx, kube, etcd, _events = world
    passes(ctx, 2)
    kube.set_pods("task", "Failed", ready=False, exit_code=code, log=f"2026 INFO serves\n{said}\n")
    passes(ctx)
    got = status(kube)
    ready = next(c for c in got["conditions"] if c["type"] == "Ready")
    seen = (got["phase"], got.get("recoveries"), etcd.current_run, ready["reason"])
    assert seen == ("Failed", 0, 1, reason)
    pod, _, why = ready["message"].partition(": ")
    assert pod.endswith("-r1") and why == said.removeprefix("nopstream task: ")
    assert not [k for k in kinds(kube) if k.startswith("Pod")]


def test_a_secret_ref_outside_the_allowed_secrets_is_invalid_and_mounts_nothing(world):
    """A StreamJob may name any Secret of its namespace; the operator would mount it into pods
    running the job's image. With the chart's jobs.allowedSecrets, only those."""
    ctx, kube, _etcd, _events = world
    ctx.pods = dataclasses.replace(ctx.pods, allowed_secrets=frozenset({"nopstream-storage"}))
    kube.streamjob["spec"]["checkpoint"]["storage"]["s3"]["secretRef"] = "db-admin"
    passes(ctx, 2)
    got = status(kube)
    valid = next(c for c in got["conditions"] if c["type"] == "Valid")
    refusal = (
        "spec.checkpoint.storage.s3.secretRef: Secret 'db-admin' is not one a StreamJob may mount"
        " (allowed: nopstream-storage; the chart's jobs.allowedSecrets) (rule: secret-allowed)"
    )
    assert (got["phase"], valid["message"]) == ("Invalid", refusal)
    assert not [k for k in kinds(kube) if k.startswith("Pod")]
    kube.streamjob["spec"]["checkpoint"]["storage"]["s3"]["secretRef"] = "nopstream-storage"
    passes(ctx, 2)
    assert status(kube)["phase"] != "Invalid"
    lookup = {"kind": "http", "url": "http://tiers/{word}", "into": "tier", "secretRef": "db-admin"}
    operators = kube.streamjob["spec"]["model"]["operators"]
    operators.append({"id": "tier", "type": "lookup", "inputs": [operators[-1]["id"]], "lookup": lookup})
    kube.streamjob["spec"]["model"]["sinks"][0]["inputs"] = ["tier"]
    passes(ctx, 2)
    valid = next(c for c in status(kube)["conditions"] if c["type"] == "Valid")
    assert valid["message"].startswith("spec.model.operators[3].lookup.secretRef: Secret 'db-admin' is not")


def test_etcd_that_lost_the_run_gets_a_new_run_past_it_never_a_run_reused(world):
    ctx, kube, etcd, events = world
    passes(ctx, 2)
    kube.set_pods("task", "Running", ready=True)
    passes(ctx)
    assert (status(kube)["run"], etcd.current_run) == (1, 1)
    etcd.current_run = 0  # etcd lost its data (an emptyDir)
    passes(ctx)
    got = status(kube)
    assert (got["phase"], got["run"], etcd.current_run) == ("Recovering", 2, 2)
    cause = "etcd lost the job's coordination state (its run reads 0, the run is 1) (run 1 -> 2)"
    assert ("Recovery", f"{cause}: restoring the latest durable epoch") in events


def test_failures_in_quick_succession_are_recovered_from_after_their_backoff(world):
    """A 6 s restart of a dependency used all recoveries in about 6 s: a pass cannot wait in place,
    so a failure quicker than its delay after the one before waits for a later pass."""
    ctx, kube, etcd, _events = world
    now = [1000.0]
    ctx.clock = lambda: now[0]
    passes(ctx, 2)
    kube.set_pods("task", "Failed", ready=False, exit_code=1)
    passes(ctx)
    assert (status(kube)["run"], status(kube)["failedAt"]) == (2, [1_000_000])  # the first at once
    now[0] += 0.1
    kube.set_pods("task", "Failed", ready=False, exit_code=1)
    passes(ctx)
    assert (status(kube)["run"], etcd.current_run) == (2, 2)  # 0.1 s after: its 0.25 s not yet out
    now[0] += 0.15
    passes(ctx)
    assert (status(kube)["run"], status(kube)["failedAt"]) == (3, [1_000_000, 1_000_250])


def test_an_invalid_spec_is_invalid_and_creates_nothing(world):
    ctx, kube, _etcd, _events = world
    kube.streamjob["spec"]["parallelism"] = 0
    passes(ctx, 2)
    assert status(kube)["phase"] == "Invalid" and kube.objects == {}
    assert kube.log == ["patch status"]  # the second pass found nothing to change


def test_a_secret_of_the_jobs_name_held_by_another_owner_stops_the_job_before_any_pod(world):
    ctx, kube, _etcd, events = world
    passes(ctx)
    kube.objects[("Secret", "wordcount-secret")] = {"metadata": {"ownerReferences": []}, "stringData": {}}
    passes(ctx, 2)
    ready = next(c for c in status(kube)["conditions"] if c["type"] == "Ready")
    assert (status(kube)["phase"], ready["reason"]) == ("Pending", "NameConflict")
    assert (
        ready["message"]
        == "Secret prod/wordcount-secret exists and is not this job's: remove it or rename this job"
    )
    assert not [k for k in kinds(kube) if k.startswith("Pod")]
    assert [r for r, _ in events].count("NameConflict") == 1


def test_a_checkpoint_namespace_another_streamjob_holds_keeps_the_job_pending_until_that_one_is_gone(world):
    """Two namespaces, one explicit checkpointNamespace and storage: the job whose claim another
    StreamJob holds creates nothing and says which holds it; once that one is gone (its deletion
    missed by the operator), the job takes the claim over and deploys."""
    ctx, kube, etcd, events = world
    kube.streamjob["spec"]["checkpointNamespace"] = "shared/wordcount"
    key = claim_key(compiled(kube.streamjob, None)[1])
    other = copy.deepcopy(kube.streamjob)
    other["metadata"] = {"namespace": "staging", "name": NAME, "uid": "u-2"}
    kube.others[("staging", NAME)] = other
    etcd.claims[key] = Holder("staging", NAME, "u-2").to_json()
    passes(ctx, 2)
    ready = next(c for c in status(kube)["conditions"] if c["type"] == "Ready")
    assert (status(kube)["phase"], ready["reason"]) == ("Pending", "CheckpointNamespaceHeld")
    assert ready["message"] == (
        "checkpoint namespace 'shared/wordcount' in s3 http://s3:9000 checkpoints/ is held by StreamJob"
        " staging/wordcount (one StreamJob per checkpoint namespace; delete that StreamJob or give this"
        " one another checkpointNamespace)"
    )
    assert kinds(kube) == [] and etcd.current_run == 0
    assert [r for r, _ in events] == ["CheckpointNamespaceHeld"]
    del kube.others[("staging", NAME)]
    passes(ctx)
    assert Holder.from_json(etcd.claims[key]) == Holder("prod", NAME, "u-1")
    assert (status(kube)["phase"], etcd.current_run) == ("Pending", 1)
    assert [k.split()[0] for k in kinds(kube)] == ["ConfigMap"]


def test_a_new_restart_nonce_starts_a_new_lineage_in_the_next_run(world):
    ctx, kube, etcd, _events = world
    passes(ctx, 2)
    kube.streamjob["spec"]["restartNonce"] = "again"
    passes(ctx)
    assert (status(kube)["run"], status(kube)["restartNonce"]) == (2, "again")
    assert etcd.requests[2].new_lineage is not None and etcd.requests[2].new_lineage.nonce == "again"
    assert not [k for k in kinds(kube) if k.startswith("Pod")]


def task_pods(kube: FakeKube, run: int) -> dict[str, dict[str, Any]]:
    """The task pods of one run, by name."""
    return {
        n: o
        for (k, n), o in kube.objects.items()
        if k == "Pod" and o["metadata"]["labels"].get("nopstream.io/run") == str(run)
    }


def running_with_standbys(ctx: Context, kube: FakeKube) -> dict[str, dict[str, Any]]:
    """A job with spec.standbyTasks brought to Running: its standby pods for run 2, by name."""
    kube.streamjob["spec"]["standbyTasks"] = True
    passes(ctx, 2)
    assert not task_pods(kube, 2)  # none while the run starts: its pods have the cores first
    kube.set_pods("task", "Running")
    kube.set_pods("coordinator", "Running")
    passes(ctx)
    assert status(kube)["phase"] == "Running"
    assert not task_pods(kube, 2)  # nor until the run's first output is out: it has the cores first
    etcd = ctx.etcd
    etcd.durable, etcd.durable_at = (etcd.durable or 0) + 1, now_ms()
    passes(ctx)
    assert not task_pods(kube, 2)  # durable, its output not yet committed
    etcd.committed_at = now_ms()
    passes(ctx)
    standbys = task_pods(kube, 2)
    assert len(standbys) == status(kube)["tasksTotal"]
    return standbys


def test_a_running_job_keeps_a_standby_pod_per_task_for_the_next_run(world):
    ctx, kube, _etcd, _events = world
    standbys = running_with_standbys(ctx, kube)
    for pod in standbys.values():
        assert pod["metadata"]["labels"]["nopstream.io/standby"] == "true"
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert (env["NOPSTREAM_RUN"], env["NOPSTREAM_STANDBY"]) == ("2", "true")
    kube.set_pods("task", "Running")  # the standbys started too: they wait
    before = list(kube.log)
    passes(ctx, 3)
    assert kube.log == before  # kept, not recreated, and no recovery


def test_a_recovery_keeps_the_pods_that_run_and_hands_the_failed_one_s_task_to_its_standby(world):
    ctx, kube, etcd, events = world
    standbys = running_with_standbys(ctx, kube)
    old = task_pods(kube, 1)
    kube.set_pods("task", "Running")
    failed = sorted(old)[0]
    kube.set_pods("task", "Failed", ready=False, exit_code=137, names={failed})
    before = len(kube.log)
    passes(ctx)
    assert (status(kube)["run"], etcd.current_run) == (2, 2)
    ids = {name: task_id_of(pod) for name, pod in old.items()}
    adopted = failed.removesuffix("-r1") + "-r2"
    # written with the run: the kept pods and the failed task's standby serve it
    assert etcd.servings[2] == {ids[n]: (adopted if n == failed else n) for n in old}
    writes = kube.log[before:]
    # the standbys the run did not need go with the failed pod; the adopted one is kept as it is
    assert sorted(w for w in writes if w.startswith("delete")) == sorted(
        f"delete Pod {n}" for n in {failed} | set(standbys) - {adopted}
    )
    assert sorted(w for w in writes if w.startswith("label")) == sorted(
        f"label Pod {n} {{'nopstream.io/run': '2'}}" for n in old if n != failed
    )
    assert set(task_pods(kube, 2)) == {adopted} | (set(old) - {failed})
    assert "nopstream.io/standby" in kube.objects[("Pod", adopted)]["metadata"]["labels"]
    assert [r for r, _ in events].count("Recovery") == 1


def running_run_1(ctx: Context, kube: FakeKube) -> dict[str, dict[str, Any]]:
    """The job started and Running in run 1: its task pods, by name."""
    passes(ctx, 2)
    kube.set_pods("task", "Running")
    kube.set_pods("coordinator", "Running")
    passes(ctx)
    return task_pods(kube, 1)


def task_id_of(pod: dict[str, Any]) -> str:
    """The task a pod was made for (its NOPSTREAM_TASK_ID)."""
    return next(e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "NOPSTREAM_TASK_ID")


def test_a_recovery_keeps_each_task_pod_that_runs_and_makes_the_others_anew(world):
    ctx, kube, etcd, _events = world
    old = running_run_1(ctx, kube)
    lost, pending = sorted(old)[:2]
    kube.set_pods("task", "Failed", ready=False, exit_code=1, names={lost})
    kube.set_pods("task", "Pending", ready=False, names={pending})  # not yet started: made anew
    before = len(kube.log)
    passes(ctx)
    assert etcd.current_run == 2
    writes = kube.log[before:]
    assert sorted(w for w in writes if w.startswith(("delete", "create"))) == sorted(
        [f"delete Pod {lost}", f"delete Pod {pending}"]
        + [f"create Pod {n.removesuffix('-r1')}-r2" for n in (lost, pending)]
    )
    kept = set(old) - {lost, pending}
    assert set(etcd.servings[2].values()) == kept | {f"{n.removesuffix('-r1')}-r2" for n in (lost, pending)}
    kube.set_pods("task", "Running")
    before = len(kube.log)
    passes(ctx, 3)
    assert status(kube)["phase"] == "Running" and status(kube)["tasksReady"] == len(old)
    assert [w for w in kube.log[before:] if not w.startswith("patch")] == []  # settled: no churn


def test_a_kept_pod_whose_task_process_failed_is_a_recovery_that_keeps_it(world):
    ctx, kube, etcd, events = world
    old = running_run_1(ctx, kube)
    reporter = sorted(old)[0]
    task_id = task_id_of(old[reporter])
    # its pod runs on: its next task process reported the failure and waits for a run
    etcd.failed = {task_id: FailureReport(reporter, 3, at_ms=int(time.time() * 1000))}
    before = len(kube.log)
    passes(ctx)
    assert etcd.current_run == 1  # not yet: a pod that died may still show itself
    ctx.clock = lambda: time.time() + REPORT_GRACE_S
    passes(ctx)
    assert etcd.current_run == 2 and set(etcd.servings[2].values()) == set(old)
    assert not [w for w in kube.log[before:] if w.startswith(("delete", "create"))]
    cause = (
        f"{reporter} (its task process, exit code 3) failed (run 1 -> 2): restoring the latest durable epoch"
    )
    assert ("Recovery", cause) in events
    passes(ctx, 2)  # the report was of run 1: no recovery more
    assert etcd.current_run == 2


def test_failure_reports_beside_a_dead_pod_are_one_recovery_that_replaces_only_the_dead_one(world):
    """A pod killed: its peers' task processes fail at once and report it, before its own death shows.
    The reports wait for it, and the one recovery keeps the reporters and replaces the dead pod."""
    ctx, kube, etcd, events = world
    old = running_run_1(ctx, kube)
    dead, *reporters = sorted(old)[:3]
    ids = {
        n: next(
            e["value"] for e in old[n]["spec"]["containers"][0]["env"] if e["name"] == "NOPSTREAM_TASK_ID"
        )
        for n in reporters
    }
    now = int(time.time() * 1000)
    etcd.failed = {ids[n]: FailureReport(n, 1, at_ms=now) for n in reporters}
    passes(ctx)
    assert etcd.current_run == 1
    kube.set_pods("task", "Failed", ready=False, exit_code=137, names={dead})
    before = len(kube.log)
    passes(ctx)
    assert etcd.current_run == 2
    assert [w for w in kube.log[before:] if w.startswith(("delete", "create"))] == [
        f"delete Pod {dead}",
        f"create Pod {dead.removesuffix('-r1')}-r2",
    ]
    said = ", ".join(sorted([dead, *(f"{n} (its task process, exit code 1)" for n in reporters)]))
    assert [m for r, m in events if r == "Recovery"] == [
        f"{said} failed (run 1 -> 2): restoring the latest durable epoch"
    ]


def test_a_kept_pod_that_does_not_answer_is_made_anew_and_its_node_avoided(world):
    """A node lost with every process on it: its pods still show Running until the node is called
    NotReady, and their peers' task processes report failures. The recovery keeps the reporters on
    node-0 and makes the silent pod of node-1 anew, preferring another node: one recovery, not two."""
    ctx, kube, etcd, events = world
    old = running_run_1(ctx, kube)
    gone, *reporters = sorted(old)[:3]
    kube.place("node-1", {gone})
    kube.place("node-0", set(old) - {gone})
    now = int(time.time() * 1000)
    etcd.failed = {task_id_of(old[n]): FailureReport(n, 1, at_ms=now) for n in reporters}
    knocked: list[list[str]] = []

    def silent(pods):
        knocked.append(sorted(p.name for p in pods))
        return frozenset({gone})

    ctx.silent = silent
    ctx.clock = lambda: time.time() + REPORT_GRACE_S
    before = len(kube.log)
    passes(ctx)
    assert etcd.current_run == 2 and knocked == [sorted(old)]  # every pod a recovery would keep
    made = f"{gone.removesuffix('-r1')}-r2"
    assert set(etcd.servings[2].values()) == (set(old) - {gone}) | {made}
    assert [w for w in kube.log[before:] if w.startswith(("delete", "create"))] == [
        f"delete Pod {gone}",
        f"create Pod {made}",
    ]
    assert kube.objects[("Pod", made)]["spec"]["affinity"] == {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]
                    },
                }
            ]
        }
    }
    (message,) = [m for r, m in events if r == "Recovery"]
    assert message.endswith(f"restoring the latest durable epoch; not kept, as they do not answer: {gone}")
    assert "affinity" not in kube.objects[("Pod", sorted(old)[3])]["spec"]  # kept pods are as they were


def test_a_standby_pod_that_failed_is_no_recovery_and_the_next_run_replaces_it(world):
    ctx, kube, etcd, _events = world
    standbys = running_with_standbys(ctx, kube)
    lost = sorted(standbys)[0]
    kube.set_pods("task", "Failed", ready=False, exit_code=137, names={lost})
    before = len(kube.log)
    passes(ctx, 3)
    assert (status(kube)["run"], etcd.current_run) == (1, 1)
    assert kube.log[before:] == []  # kept as it is: a standby that cannot start never churns pods
    kube.set_pods("task", "Failed", ready=False, exit_code=1, names={sorted(task_pods(kube, 1))[0]})
    passes(ctx)
    assert etcd.current_run == 2
    assert kube.log.count(f"delete Pod {lost}") == 1 and kube.objects[("Pod", lost)].get("status") is None
    assert "nopstream.io/standby" not in kube.objects[("Pod", lost)]["metadata"]["labels"]  # a new pod


def test_standby_pods_go_when_the_job_succeeds_or_the_spec_turns_them_off(world):
    ctx, kube, _etcd, _events = world
    standbys = running_with_standbys(ctx, kube)
    kube.streamjob["spec"]["standbyTasks"] = False
    passes(ctx)
    assert not task_pods(kube, 2)
    kube.streamjob["spec"]["standbyTasks"] = True
    passes(ctx)
    assert set(task_pods(kube, 2)) == set(standbys)
    kube.set_pods("task", "Succeeded", ready=False, exit_code=0, names=set(task_pods(kube, 1)))
    passes(ctx, 2)
    assert status(kube)["phase"] == "Succeeded" and not task_pods(kube, 2)


def test_runs_begun_otherwise_than_by_a_recovery_hand_nothing_to_standby_pods(world):
    ctx, kube, etcd, _events = world
    running_with_standbys(ctx, kube)
    kube.streamjob["spec"]["restartNonce"] = "again"
    passes(ctx)
    assert etcd.current_run == 2 and etcd.servings[2] is None
    assert not [k for k in kinds(kube) if k.startswith("Pod")]  # the standbys went with the rest


def condition(kube: FakeKube, kind: str) -> tuple[str, str, str]:
    found = next(c for c in status(kube)["conditions"] if c["type"] == kind)
    return found["status"], found["reason"], found.get("message", "")


def test_ready_only_while_epochs_keep_becoming_durable_and_degraded_while_they_do_not(world):
    ctx, kube, etcd, events = world
    kube.streamjob["spec"]["checkpoint"]["timeoutMs"] = 5_000  # bound: 1 s interval + 5 s timeout
    passes(ctx, 2)
    assert condition(kube, "Progressing")[:2] == ("True", "Pending")
    kube.set_pods("task", "Running")
    kube.set_pods("coordinator", "Running")
    etcd.durable, etcd.durable_at = 4, now_ms() - 1_000
    etcd.leader = ("wordcount-coordinator-0", 17)
    passes(ctx)
    assert condition(kube, "Ready")[:2] == ("True", "AllTasksReady")
    assert condition(kube, "Progressing")[:2] == ("False", "Running")
    assert condition(kube, "Degraded")[:2] == ("False", "AsExpected")
    got = status(kube)
    assert got["leader"] == {"pod": "wordcount-coordinator-0", "token": 17}
    assert got["latestDurableAt"] == rfc3339(etcd.durable_at)

    for c in status(kube)["conditions"]:  # the run has been running for ten minutes
        if c["type"] == "Progressing":
            c["lastTransitionTime"] = rfc3339(now_ms() - 600_000)
    passes(ctx)
    assert condition(kube, "Ready")[:2] == ("True", "AllTasksReady")
    etcd.durable_at = now_ms() - 7_000  # and nothing durable for longer than the bound
    passes(ctx, 2)
    message = (
        "no epoch became durable for longer than 6 s (checkpoint interval + timeout);"
        " the latest durable is epoch 4"
    )
    assert condition(kube, "Ready") == ("False", "EpochsStalled", message)
    assert condition(kube, "Degraded") == ("True", "EpochsStalled", message)
    assert status(kube)["phase"] == "Running"  # still running: not ready
    assert [m for r, m in events if r == "EpochsStalled"] == [message]  # one event, not one per pass
    before = list(kube.log)
    passes(ctx, 2)
    assert kube.log == before  # a stalled job's passes write nothing more

    etcd.durable, etcd.durable_at = 5, now_ms()
    passes(ctx)
    assert condition(kube, "Ready")[:2] == ("True", "AllTasksReady")
    assert condition(kube, "Degraded")[:2] == ("False", "AsExpected")


def test_a_new_run_is_judged_from_its_start_not_from_the_old_runs_last_epoch(world):
    ctx, kube, etcd, _events = world
    kube.streamjob["spec"]["checkpoint"]["timeoutMs"] = 5_000
    passes(ctx, 2)
    kube.set_pods("coordinator", "Running")
    etcd.durable, etcd.durable_at = 3, now_ms() - 600_000  # the old run stalled long ago
    kube.set_pods("task", "Failed", ready=False, exit_code=137)
    passes(ctx)
    assert status(kube)["phase"] == "Recovering"
    assert condition(kube, "Progressing")[:2] == ("True", "Recovering")
    assert condition(kube, "Degraded")[:2] == ("False", "AsExpected")
    kube.set_pods("task", "Running")
    passes(ctx)
    assert condition(kube, "Ready")[:2] == ("True", "AllTasksReady")


def test_a_failed_or_invalid_job_is_degraded_with_its_reason(world):
    ctx, kube, _etcd, _events = world
    kube.streamjob["spec"]["maxRecoveries"] = 0
    passes(ctx, 2)
    kube.set_pods("task", "Failed", ready=False, exit_code=1)
    passes(ctx)
    assert status(kube)["phase"] == "Failed"
    assert condition(kube, "Degraded")[:2] == ("True", "TooManyRecoveries")
    assert condition(kube, "Progressing")[:2] == ("False", "Failed")

    kube.streamjob["spec"]["parallelism"] = 0
    kube.streamjob["metadata"]["generation"] = 2
    passes(ctx)
    assert status(kube)["phase"] == "Invalid"
    status_, reason, message = condition(kube, "Degraded")
    assert (status_, reason) == ("True", "ValidationFailed") and "parallelism" in message


def test_the_pods_of_a_run_are_decided_from_what_was_observed_alone(world):
    """`decide_pods` takes no context: the same observation gives the same decision, and a
    failed task, a refusal and a lost etcd each give theirs, exactly."""
    ctx, kube, etcd, _events = world
    passes(ctx, 2)
    kube.set_pods("coordinator", "Running")
    kube.set_pods("task", "Running")

    def decided() -> RunPods:
        seen = observe(ctx, "prod", NAME)
        assert seen is not None
        _, deployment = deployed_plans(ctx, seen)
        seen = dataclasses.replace(seen, etcd_seen=etcd.observe(None))
        return decide_pods(
            dataclasses.replace(seen, model=compiled(seen.job, None)[0]), deployment, now=time.time()
        )

    before = list(kube.log)
    whole = decided()
    assert (whole.create_coordinators, whole.delete, whole.outcome) == ((), (), Whole(()))
    assert decided() == whole and kube.log == before  # nothing written by deciding
    etcd.current_run = 0
    assert decided().outcome == Lost("etcd lost the job's coordination state (its run reads 0, the run is 1)")
    etcd.current_run = 1
    one = min(n for k, n in kube.objects if k == "Pod" and "coordinator" not in n)
    kube.set_pods("task", "Failed", ready=False, exit_code=1, log="Traceback\nValueError: boom", names={one})
    assert decided().outcome == Lost(f"{one} failed: ValueError: boom")
    kube.set_pods(
        "task", "Failed", ready=False, exit_code=6, log="nopstream task: bad input: line 3", names={one}
    )
    assert decided().outcome == Refused("BadInput", f"{one}: bad input: line 3")
