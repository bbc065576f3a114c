"""The supervisor's blocking etcd calls (`local.etcd_calls`): one client on one loop, each call bounded."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from e2e import servers
from nopstream.cluster.backend import StoreUnavailable
from nopstream.local.etcd_calls import EtcdCalls


def test_a_call_etcd_does_not_answer_is_an_outage_and_the_calls_after_it_are_answered(tmp_path):
    """etcd frozen (SIGSTOP: its port open, nothing answered) makes a call StoreUnavailable within its
    bound instead of a wait without end; thawed, the same client answers again, call after call; closed,
    its thread is gone."""
    etcd = servers.start_etcd(tmp_path)
    host, port = etcd.endpoint
    calls = EtcdCalls(f"{host}:{port}")
    try:
        calls(lambda backend: backend.put("k", b"v"))
        os.kill(etcd.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as frozen:
                calls(lambda backend: backend.get("k"), timeout=1.0)
            assert str(frozen.value) == f"etcd at {host}:{port} did not answer within 1 s"
            assert time.monotonic() - started < 3
        finally:
            os.kill(etcd.process.pid, signal.SIGCONT)
        for _ in range(200):
            entry = calls(lambda backend: backend.get("k"))
            assert entry is not None and entry.value == b"v"
    finally:
        calls.close()
        etcd.stop()
    assert not any(t.name == "etcd calls" for t in threading.enumerate())
