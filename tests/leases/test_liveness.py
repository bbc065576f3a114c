"""A task process's liveness endpoint (`node.liveness`): it answers while the process runs and
not while it is stopped, where the task port (a TCP probe's target) still accepts.

A real `nopstream task` process (a standby: it waits without needing a coordinator)
against real etcd, stopped with SIGSTOP as a frozen or wedged process would be.
"""

from __future__ import annotations

import os
import signal
import socket
import urllib.error
import urllib.request
import uuid

import pytest

from e2e import servers
from tests.leases.test_standby import PodTask


def get(port: int, path: str = "/healthz") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1.5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_liveness_answers_while_the_process_runs_and_not_while_it_is_stopped(tmp_path, etcd_server):
    task = PodTask(tmp_path, etcd_server.endpoint, f"live-{uuid.uuid4().hex[:8]}")
    health = servers.free_port()
    task.env["NOPSTREAM_HEALTH_PORT"] = str(health)
    task.registry(lambda r: r.advance_run(0))
    task.start()
    assert task.proc is not None
    try:
        task.until("standing by", task.standing_by)
        assert get(health) == (200, "ok\n")
        assert get(health, "/other") == (404, "not found\n")
        stopped = [task.proc.pid, *task.children()]  # the pod's process and the task process it forked
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises((TimeoutError, urllib.error.URLError)):
                get(health)  # the liveness probe fails: the kubelet ends the pod, the job recovers
            with socket.socket() as s:  # while a TCP probe would still pass: the kernel accepts
                assert s.connect_ex(("127.0.0.1", task.port)) == 0
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        assert get(health) == (200, "ok\n")
    finally:
        task.stop()
