"""The Argo CD health check (docs/argocd/streamjob-health.lua) on the statuses the operator writes.

Argo CD runs health checks in Lua 5.1; Debian's `lua5.1` with `lua-cjson` runs the
script here on each StreamJob as real passes of `reconcile_once` left it (its two
adapters faked by `test_reconcile.py`'s `world`), and on a suspended job's status.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from nopstream_operator.health import now_ms, rfc3339

from tests.conftest import ROOT
from tests.operator import test_reconcile
from tests.operator.test_reconcile import passes

world = test_reconcile.world  # the same fixture: real passes against its fakes
SCRIPT = ROOT / "docs" / "argocd" / "streamjob-health.lua"
DRIVER = """
local cjson = require("cjson")
local file = assert(io.open(arg[1]))
obj = cjson.decode(file:read("*a"))
file:close()
local hs = assert(loadfile(arg[2]))()
io.write(cjson.encode({status = hs.status, message = hs.message}))
"""


@pytest.fixture
def health(tmp_path: Path):
    lua = shutil.which("lua5.1")
    assert lua is not None, "lua5.1 is missing: run scripts/install-servers.sh lua"
    (tmp_path / "driver.lua").write_text(DRIVER)

    def check(obj: dict) -> tuple[str, str]:
        (tmp_path / "obj.json").write_text(json.dumps(obj))
        done = subprocess.run(
            [lua, str(tmp_path / "driver.lua"), str(tmp_path / "obj.json"), str(SCRIPT)],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        answer = json.loads(done.stdout)
        return answer["status"], answer["message"]

    return check


def test_a_job_from_its_first_pass_to_its_end(world, health):
    ctx, kube, etcd, _events = world
    kube.streamjob["spec"]["checkpoint"]["timeoutMs"] = 5_000
    assert health(kube.streamjob) == ("Progressing", "waiting for the operator")
    passes(ctx, 2)
    assert health(kube.streamjob)[0] == "Progressing"
    kube.set_pods("task", "Running")
    kube.set_pods("coordinator", "Running")
    etcd.durable, etcd.durable_at = 3, now_ms()
    passes(ctx)
    total = kube.streamjob["status"]["tasksTotal"]
    assert health(kube.streamjob) == ("Healthy", f"{total}/{total} tasks ready")

    for c in kube.streamjob["status"]["conditions"]:  # running for ten minutes, no epoch for 7 s
        if c["type"] == "Progressing":
            c["lastTransitionTime"] = rfc3339(now_ms() - 600_000)
    etcd.durable_at = now_ms() - 7_000
    passes(ctx)
    status, message = health(kube.streamjob)
    assert (status, message.split(";")[0]) == (
        "Degraded",
        "no epoch became durable for longer than 6 s (checkpoint interval + timeout)",
    )

    kube.set_pods("task", "Failed", ready=False, exit_code=137)
    passes(ctx)
    assert kube.streamjob["status"]["phase"] == "Recovering"
    assert health(kube.streamjob)[0] == "Progressing"
    kube.set_pods("task", "Running")
    passes(ctx)
    assert health(kube.streamjob)[0] == "Healthy"

    kube.set_pods("task", "Succeeded", ready=False, exit_code=0)
    passes(ctx)
    assert health(kube.streamjob) == ("Healthy", "the final epoch is committed")


def test_a_failed_an_invalid_and_a_suspended_job(world, health):
    ctx, kube, _etcd, _events = world
    kube.streamjob["spec"]["maxRecoveries"] = 0
    passes(ctx, 2)
    kube.set_pods("task", "Failed", ready=False, exit_code=1)
    passes(ctx)
    status, message = health(kube.streamjob)
    assert status == "Degraded" and message.endswith("the job has failed")

    kube.streamjob["spec"]["parallelism"] = 0
    kube.streamjob["metadata"]["generation"] = 2
    passes(ctx)
    status, message = health(kube.streamjob)
    assert status == "Degraded" and "parallelism" in message

    suspended = {
        "metadata": {"name": "x", "generation": 3},
        "status": {
            "phase": "Suspended",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "Suspended", "message": "at savepoint 12"}
            ],
        },
    }
    assert health(suspended) == ("Suspended", "at savepoint 12")
