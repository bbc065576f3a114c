"""Coordinator failover and split brain with real processes on a real etcd server."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from nopstream.cluster.epochlog import EpochLog
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from tests.conftest import ROOT

TTL = 2


class Candidate:
    """A candidate process and the lines it prints."""

    def __init__(self, etcd, job: str, name: str) -> None:
        host, port = etcd.endpoint
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.leases.candidate", host, str(port), job, name, str(TTL)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line.startswith(prefix):
                return line
        raise AssertionError(f"{self.name} did not print {prefix!r} within {timeout}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def candidates(etcd_server, request):
    started: list[Candidate] = []

    def start(name: str) -> Candidate:
        c = Candidate(etcd_server, request.node.name, name)
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()


def entries(etcd, job: str):
    async def read():
        backend = EtcdBackend(*etcd.endpoint)
        try:
            layout = Layout("failover", job, "main")
            raw = await backend.get_prefix(layout.epochs)
            return await EpochLog(backend, layout).entries(), raw
        finally:
            await backend.close()

    return asyncio.run(read())


def test_standby_takes_over_within_the_ttl_after_sigkill(candidates, etcd_server, capsys):
    a = candidates("coord-a")
    a.expect("LEADER coord-a", 20)
    b = candidates("coord-b")
    time.sleep(1.0)  # b is campaigning: the seat is taken
    assert b.lines.empty()
    killed_at = time.time()
    a.proc.send_signal(signal.SIGKILL)
    _, _, token, won_at = b.expect("LEADER coord-b", TTL + 5).split()
    takeover = float(won_at) - killed_at
    with capsys.disabled():
        print(f"\n[failover] SIGKILL -> standby leads in {takeover:.2f}s (lease TTL {TTL}s)")
    assert takeover <= TTL + 1.0
    assert int(token) > 0


def test_paused_leader_is_fenced_after_a_takeover(candidates, etcd_server, request):
    a = candidates("coord-a")
    _, _, token_a, _ = a.expect("LEADER coord-a", 20).split()
    time.sleep(0.5)  # a writes a few epochs
    b = candidates("coord-b")
    time.sleep(0.5)
    a.proc.send_signal(signal.SIGSTOP)
    _, _, token_b, _ = b.expect("LEADER coord-b", TTL + 5).split()
    assert int(token_b) > int(token_a)
    time.sleep(0.5)  # b writes epochs while a is frozen, believing it still leads
    a.proc.send_signal(signal.SIGCONT)
    a.expect("FENCED coord-a", 10)
    assert a.proc.wait(10) == 4  # it stepped down
    time.sleep(0.3)
    log, raw = entries(etcd_server, request.node.name)
    writers = {e.writer for e in log}
    assert writers == {"coord-a", "coord-b"}
    for entry in raw.values():
        # nothing written by a after b won: every entry a wrote predates b's token
        if b'"writer": "coord-a"' in entry.value:
            assert entry.mod_revision < int(token_b)
    assert [e.writer for e in log] == sorted(e.writer for e in log)  # a's epochs, then b's
