"""A standby task process (`NOPSTREAM_STANDBY`) against real etcd: it serves its run only when a
recovery hands the run to its plan, and otherwise leaves without ever registering.

Each case starts a real `nopstream task` process for run 2 while run 1 is current,
then moves the run the way the operator would: a recovery (with the plan's takeover),
a recovery of another plan, a restart (no takeover), or a run already past.
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
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.registry import Registry
from nopstream.model.load import load_data
from nopstream.node.wire import guard
from nopstream.plan import compiler
from tests.conftest import ROOT

MODEL = {
    "sources": [{"id": "src", "type": "generator", "config": {"kind": "sequence", "count": 10}}],
    "sinks": [{"id": "out", "type": "file", "inputs": ["src"], "config": {"path": "out"}}],
}
S3 = {"storage": {"s3": {"endpoint": "http://127.0.0.1:9", "bucket": "checkpoints"}}}


class StandbyTask:
    """A `nopstream task` process standing by for run 2 of its own job, and that job's registry."""

    def __init__(self, tmp: Path, etcd: tuple[str, int], job: str) -> None:
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
        self.env = {
            "NOPSTREAM_PLAN_DIR": str(tmp),
            "NOPSTREAM_ETCD": "{}:{}".format(*etcd),
            "NOPSTREAM_ATTEMPT": f"{job}-src-0-r2",
            "NOPSTREAM_SECRET_FILE": str(tmp / "secret"),
            "NOPSTREAM_TASK_ID": self.task_id,
            "NOPSTREAM_RUN": "2",
            "NOPSTREAM_STANDBY": "true",
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

    def registered(self) -> bool:
        async def read(registry: Registry) -> bool:
            return self.task_id in await registry.tasks(2)

        return bool(self.registry(read))

    def standing_by(self) -> bool:
        """It has said so and its port accepts (the pod's TCP probe passes)."""
        if "stands by for run 2" not in self.text():
            return False
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0


@pytest.fixture
def standby(tmp_path, etcd_server):
    task = StandbyTask(tmp_path, etcd_server.endpoint, f"standby-{uuid.uuid4().hex[:8]}")
    task.registry(lambda r: r.advance_run(0))  # run 1 is current
    yield task
    task.stop()


def test_a_standby_serves_its_run_when_a_recovery_hands_it_over(standby):
    standby.start()
    standby.until("standing by", standby.standing_by)
    time.sleep(1.0)
    assert not standby.registered()  # never under a run that is not current
    assert standby.registry(lambda r: r.advance_run(1, takeover=standby.plan))
    standby.until("its registration in run 2", standby.registered, timeout=10)
    serves = f"task {standby.task_id} serves http://127.0.0.1:{standby.port} (run 2"
    # it registers, then logs: a CI run read the log between the two
    standby.until("its line in the log", lambda: serves in standby.text(), timeout=10)


@pytest.mark.parametrize(
    "move",
    ["a restart (no takeover)", "a recovery of another plan", "a run already past"],
)
def test_a_standby_whose_run_began_otherwise_leaves_without_registering(standby, move):
    if move == "a run already past":
        standby.registry(lambda r: r.advance_run(1))
        standby.registry(lambda r: r.advance_run(2))
        standby.start()
    else:
        standby.start()
        standby.until("standing by", standby.standing_by)
        takeover = None if move.startswith("a restart") else "sha256:" + "0" * 64
        assert standby.registry(lambda r: r.advance_run(1, takeover=takeover))
    assert standby.proc is not None
    assert standby.proc.wait(20) == 0, standby.text()
    assert f"standby task {standby.task_id} was not needed: run 2 began without it" in standby.text()
    assert not standby.registered()


def test_a_task_started_while_etcd_is_down_waits_for_it_instead_of_failing(tmp_path):
    port = servers.free_port()
    task = StandbyTask(tmp_path, ("127.0.0.1", port), "standby-etcd-late")
    task.start()
    try:
        task.until("it waits for etcd", lambda: "etcd is unreachable" in task.text())
        assert task.proc is not None and task.proc.poll() is None  # still there, not failed
        etcd = servers.start_etcd(tmp_path / "etcd", client_port=port)
        try:
            task.registry(lambda r: r.advance_run(0))
            task.until("standing by", task.standing_by)
            assert task.registry(lambda r: r.advance_run(1, takeover=task.plan))
            task.until("its registration in run 2", task.registered, timeout=10)
        finally:
            task.stop()
            etcd.stop()
    finally:
        task.stop()
