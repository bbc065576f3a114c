"""A pod's task process against real etcd: a standby (`NOPSTREAM_STANDBY`) serves its run only
when a recovery hands the run to it, and otherwise leaves without ever registering; a resident
one (`NOPSTREAM_RESIDENT`, `node.resident`) serves each later run a recovery hands its pod, from a
new task process forked by the same pod process.

Each standby case starts a real `nopstream task` process for run 2 while run 1 is current,
then moves the run the way the operator would: a recovery that names it in the run's
serving map, one that names another pod, a restart (no map), or a run already past. Each
resident case starts one for run 1 while run 1 is current.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from e2e import servers
from nopstream.checkpoint.restore import RestorePoint
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.registry import FailureReport, Registry
from nopstream.errors import REFUSED_EXITS
from nopstream.local import kills
from nopstream.model.load import load_data
from nopstream.node.wire import guard
from nopstream.plan import compiler
from tests.conftest import ROOT

MODEL = {
    "sources": [{"id": "src", "type": "generator", "config": {"kind": "sequence", "count": 10}}],
    "sinks": [{"id": "out", "type": "file", "inputs": ["src"], "config": {"path": "out"}}],
}
S3 = {"storage": {"s3": {"endpoint": "http://127.0.0.1:9", "bucket": "checkpoints"}}}


class PodTask:
    """A pod's `nopstream task` process of its own job, made for run 2 as a standby or for run 1 as a
    resident, and that job's registry."""

    def __init__(self, tmp: Path, etcd: tuple[str, int], job: str, *, resident: bool = False) -> None:
        plans = compiler.compile_model(
            load_data({"jobId": job, "checkpoint": S3, "model": MODEL}), backend="kubernetes"
        )
        (tmp / "partitioned.json").write_text(compiler.dump_document(plans.partitioned))
        (tmp / "deployment.json").write_text(compiler.dump_document(plans.deployment))
        guard.write_secret(tmp / "secret", guard.new_secret())
        (self.task_id,) = plans.partitioned.task_ids()
        self.plan = plans.deployment.partitioned_fingerprint
        self.layout = Layout(plans.deployment.namespace, job, plans.partitioned.identity.pipeline_id)
        self.etcd, self.port, self.log = etcd, servers.free_port(), tmp / "task.log"
        self.run = 1 if resident else 2
        self.attempt = f"{job}-src-0-r{self.run}"
        self.env = {
            "NOPSTREAM_PLAN_DIR": str(tmp),
            "NOPSTREAM_ETCD": "{}:{}".format(*etcd),
            "NOPSTREAM_ATTEMPT": self.attempt,
            "NOPSTREAM_SECRET_FILE": str(tmp / "secret"),
            "NOPSTREAM_TASK_ID": self.task_id,
            "NOPSTREAM_RUN": str(self.run),
            "NOPSTREAM_RESIDENT": "true",
            **({} if resident else {"NOPSTREAM_STANDBY": "true"}),
            "NOPSTREAM_PORT": str(self.port),
            "NOPSTREAM_LEASE_TTL": "4",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nopstream", "task"],
                env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'operator'}", **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)

    def text(self) -> str:
        return self.log.read_text()

    def until(self, what: str, check, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := check():
                return value
            assert self.proc is None or self.proc.poll() is None or what == "exit", (
                f"the task exited ({self.proc.returncode}) before {what}:\n{self.text()}"
            )
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n{self.text()}")

    def registry(self, action):
        """Run `action(registry)` against this job's registry in etcd."""

        async def go():
            backend = EtcdBackend(*self.etcd)
            try:
                return await action(Registry(backend, self.layout))
            finally:
                await backend.close()

        return asyncio.run(go())

    def registered(self, run: int = 2) -> bool:
        async def read(registry: Registry) -> bool:
            return self.task_id in await registry.tasks(run)

        return bool(self.registry(read))

    def hand_over(self, run: int, to: str | None = None) -> bool:
        """Advance the run from `run`, handing the task to pod `to` (this one by default)."""
        serving = {self.task_id: to or self.attempt}
        return bool(self.registry(lambda r: r.advance_run(run, serving=serving)))

    def children(self) -> list[int]:
        """The pod process's task processes."""
        assert self.proc is not None
        return kills.children(self.proc.pid)

    def standing_by(self) -> bool:
        """It has said so and its port accepts (the pod's TCP probe passes)."""
        if f"stands by for run {self.run}" not in self.text():
            return False
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0


@pytest.fixture
def standby(tmp_path, etcd_server):
    task = PodTask(tmp_path, etcd_server.endpoint, f"standby-{uuid.uuid4().hex[:8]}")
    task.registry(lambda r: r.advance_run(0))  # run 1 is current
    yield task
    task.stop()


@pytest.fixture
def resident(tmp_path, etcd_server):
    task = PodTask(tmp_path, etcd_server.endpoint, f"resident-{uuid.uuid4().hex[:8]}", resident=True)
    task.registry(lambda r: r.advance_run(0))  # run 1 is current
    yield task
    task.stop()


def test_a_standby_serves_its_run_when_a_recovery_hands_it_over(standby):
    standby.start()
    standby.until("standing by", standby.standing_by)
    time.sleep(1.0)
    assert not standby.registered()  # never under a run that is not current
    assert standby.hand_over(1)
    standby.until("its registration in run 2", standby.registered, timeout=10)
    serves = f"task {standby.task_id} serves http://127.0.0.1:{standby.port} (run 2"
    # it registers, then logs: a CI run read the log between the two
    standby.until("its line in the log", lambda: serves in standby.text(), timeout=10)


@pytest.mark.parametrize(
    "move",
    ["a restart (no serving map)", "a recovery that hands the task to another pod", "a run already past"],
)
def test_a_standby_whose_run_began_otherwise_leaves_without_registering(standby, move):
    if move == "a run already past":
        standby.registry(lambda r: r.advance_run(1))
        standby.registry(lambda r: r.advance_run(2))
        standby.start()
    else:
        standby.start()
        standby.until("standing by", standby.standing_by)
        if move.startswith("a restart"):
            assert standby.registry(lambda r: r.advance_run(1))
        else:
            assert standby.hand_over(1, to="another-pod")
    assert standby.proc is not None
    assert standby.proc.wait(20) == 0, standby.text()
    assert (
        f"task {standby.task_id} ({standby.attempt}) is not needed: a run began without it" in standby.text()
    )
    assert not standby.registered()


def test_a_task_started_while_etcd_is_down_waits_for_it_instead_of_failing(tmp_path):
    port = servers.free_port()
    task = PodTask(tmp_path, ("127.0.0.1", port), "standby-etcd-late")
    task.start()
    try:
        task.until("it waits for etcd", lambda: "etcd is unreachable" in task.text())
        assert task.proc is not None and task.proc.poll() is None  # still there, not failed
        etcd = servers.start_etcd(tmp_path / "etcd", client_port=port)
        try:
            task.registry(lambda r: r.advance_run(0))
            task.until("standing by", task.standing_by)
            assert task.hand_over(1)
            task.until("its registration in run 2", task.registered, timeout=10)
        finally:
            task.stop()
            etcd.stop()
    finally:
        task.stop()


def test_a_resident_task_kept_by_a_recovery_serves_the_next_run_from_a_new_task_process(resident):
    resident.start()
    resident.until("its registration in run 1", lambda: resident.registered(1), timeout=20)
    (first,) = resident.children()
    handed = time.monotonic()
    assert resident.hand_over(1)
    resident.until("its registration in run 2", resident.registered, timeout=10)
    took = time.monotonic() - handed
    print(f"\n[resident] run handed over -> registered in the next run: {took:.2f} s")
    assert "run 1 is over (run 2 is current): this task process ends" in resident.text()
    (second,) = resident.children()
    assert second != first and resident.proc is not None and resident.proc.poll() is None
    assert took < 3.0  # a fork, not a start: no interpreter, no imports


def test_a_resident_task_the_next_run_does_not_name_ends_its_pod_with_0(resident):
    resident.start()
    resident.until("its registration in run 1", lambda: resident.registered(1), timeout=20)
    assert resident.hand_over(1, to="another-pod")
    assert resident.proc is not None and resident.proc.wait(20) == 0, resident.text()
    assert f"task {resident.task_id} ({resident.attempt}) is not needed" in resident.text()
    assert not resident.registered()


def test_a_resident_task_process_that_dies_is_reported_and_its_pod_serves_the_run_it_is_handed(resident):
    resident.start()
    resident.until("its registration in run 1", lambda: resident.registered(1), timeout=20)
    (first,) = resident.children()
    os.kill(first, signal.SIGKILL)

    async def reports(registry: Registry) -> dict[str, FailureReport]:
        return await registry.failed(1)

    killed = time.time()
    (report,) = resident.until("the failure report", lambda: resident.registry(reports), timeout=10).items()
    assert report[0] == resident.task_id
    assert (report[1].attempt, report[1].exit_code) == (resident.attempt, 128 + signal.SIGKILL)
    assert killed - 1 <= report[1].at_ms / 1000 <= time.time()
    assert (
        "the task process of run 1 failed (exit code 137): the pod waits for the next run" in resident.text()
    )
    assert resident.proc is not None and resident.proc.poll() is None  # the pod lives on
    assert resident.hand_over(1)
    resident.until("its registration in run 2", resident.registered, timeout=10)


def test_a_refused_start_ends_a_resident_pod_at_once_with_its_code(resident):
    resident.start()
    resident.until("its registration in run 1", lambda: resident.registered(1), timeout=20)

    async def refuse(registry: Registry) -> None:
        refusal = RestorePoint.refusal_json("checkpoint namespace x holds another job's plan")
        await registry.backend.put(resident.layout.restore(1), refusal)

    resident.registry(refuse)
    assert resident.proc is not None
    code = resident.proc.wait(20)
    assert code in REFUSED_EXITS and code != 0, resident.text()
    assert "checkpoint namespace x holds another job's plan" in resident.text().splitlines()[-1]
