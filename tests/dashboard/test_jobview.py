"""The job's view (GET /api/v1/job) from its history, and the routes that serve it and the dashboard.

Rates come from two stats of one task of one run (the task's own clock); a vertex
shows its subtasks' summed rates, its worst subtask's shares and its lowest watermark
once every subtask has one; levels are Flink's. Over real HTTP: the page and its files
are open and counted as no refusal, the view needs the secret, a path that climbs out
of the files is not served, a malformed stats body is refused naming its field.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import aiohttp
import pytest

from nopstream.model.load import load_data
from nopstream.node.view.jobview import DASHBOARD_FILES, JobHistory, backpressure_level, job_view
from nopstream.node.wire import guard
from nopstream.node.wire.coordinator_api import CoordinatorRoutes
from nopstream.plan import compiler
from nopstream.plan.epochs import EpochKind
from nopstream.runtime.metrics import TaskStats
from tests.conftest import serving

MODEL = {
    "jobId": "viewed",
    "model": {
        "sources": [{"id": "src", "type": "generator", "parallelism": 1, "config": {"count": 10}}],
        "operators": [{"id": "double", "type": "map", "fn": "x:y", "parallelism": 2}],
        "sinks": [{"id": "out", "type": "file", "parallelism": 2, "config": {"path": "out"}}],
    },
}


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def plan():
    return compiler.compile_model(load_data(MODEL)).partitioned


def test_rates_come_from_two_stats_of_one_run_and_a_vertex_shows_its_worst_subtask():
    clock = Clock()
    history = JobHistory(plan(), clock=clock)
    src, map0, map1 = "viewed/main/src/0", "viewed/main/double/0", "viewed/main/double/1"
    history.stats(src, 1, TaskStats(records_out=100, uptime_ms=1000, watermark=50))
    history.stats(map0, 1, TaskStats(records_in=40, uptime_ms=1000, idle_ms=500, watermark=40))
    first = job_view(history, latest_durable=None, latest_committed=None, state="running")
    assert [v["busy"] for v in first["graph"]["vertices"]] == [0.0, 0.0]  # one stats: nothing measured
    clock.now += 2000
    history.stats(src, 1, TaskStats(records_out=2100, uptime_ms=3000, backpressured_ms=1600, watermark=70))
    history.stats(map0, 1, TaskStats(records_in=1040, uptime_ms=3000, idle_ms=1500, watermark=45))
    history.stats(map1, 1, TaskStats(records_in=500, uptime_ms=1000, idle_ms=200))
    history.stats(map1, 1, TaskStats(records_in=1500, uptime_ms=3000, idle_ms=1400, watermark=44))
    view = job_view(history, latest_durable=3, latest_committed=2, state="running")
    source, mapper = view["graph"]["vertices"]
    assert (source["id"], source["parallelism"], mapper["parallelism"]) == ("src", 1, 2)
    assert (source["recordsOutPerSecond"], source["backpressured"], source["busy"]) == (1000.0, 0.8, 0.2)
    assert (source["level"], source["watermark"], source["watermarkLagMs"]) == ("high", 70, 1_002_000 - 70)
    # map0: 500 records/s, half idle; map1: 500 records/s, 60 % idle; busy is the worst subtask's
    assert (mapper["recordsInPerSecond"], mapper["busy"], mapper["backpressured"]) == (1000.0, 0.5, 0.0)
    assert (mapper["level"], mapper["watermark"]) == ("ok", 44)
    assert view["graph"]["edges"] == [
        {"id": view["graph"]["edges"][0]["id"], "source": "src", "target": "double", "policy": "REBALANCE"}
    ]
    assert view["checkpoints"] == {"latestDurable": 3, "latestCommitted": 2, "history": []}
    by_task = {t["id"]: t for t in view["tasks"]}
    assert by_task[map1] == {
        "id": map1,
        "vertex": "double",
        "reported": True,
        "run": 1,
        "recordsIn": 1500,
        "recordsOut": 0,
        "deadLetters": 0,
        "lookups": {},
        "watermark": 44,
        "idle": 0.6,
        "backpressured": 0.0,
        "busy": 0.4,
    }
    clock.now += 1000
    history.stats(src, 2, TaskStats(records_out=10, uptime_ms=500))  # a new run: its task starts afresh
    after = job_view(history, latest_durable=3, latest_committed=3, state="running")
    assert (after["graph"]["vertices"][0]["busy"], after["tasks"][0]["run"]) == (0.0, 2)


def test_the_watermark_of_a_vertex_waits_for_every_subtask_and_levels_are_flinks():
    history = JobHistory(plan(), clock=Clock())
    history.stats("viewed/main/double/0", 1, TaskStats(uptime_ms=10, watermark=5))
    view = job_view(history, latest_durable=None, latest_committed=None, state="starting")
    assert view["graph"]["vertices"][1]["watermark"] is None
    assert [backpressure_level(r) for r in (0.0, 0.10, 0.1001, 0.5, 0.5001, 1.0)] == [
        "ok",
        "ok",
        "low",
        "low",
        "high",
        "high",
    ]


def test_epoch_rows_are_replaced_by_epoch_newest_first_and_runs_and_failures_are_kept():
    clock = Clock()
    history = JobHistory(plan(), clock=clock)
    history.run_started(1, None, "start")
    clock.now = 10
    history.epoch_started(1, EpochKind.CHECKPOINT, 1)
    clock.now = 20
    history.epoch_started(2, EpochKind.CHECKPOINT, 1)
    history.epoch_ended(1, state="durable", duration_ms=7, bytes=99, slowest_task="t", alignment_ms=1.5)
    history.epoch_ended(2, state="aborted", reason="timeout: no ACK of t")
    history.failed(1, "viewed/main/src/0", "Traceback ...\nValueError: bad")
    history.run_started(2, 1, "task viewed/main/src/0 failed")
    view = job_view(history, latest_durable=1, latest_committed=1, state="running")
    assert view["checkpoints"]["history"] == [
        {
            "epoch": 2,
            "kind": "checkpoint",
            "run": 1,
            "state": "aborted",
            "triggeredAt": 20,
            "durationMs": None,
            "alignmentMs": None,
            "bytes": 0,
            "slowestTask": None,
            "reason": "timeout: no ACK of t",
        },
        {
            "epoch": 1,
            "kind": "checkpoint",
            "run": 1,
            "state": "durable",
            "triggeredAt": 10,
            "durationMs": 7,
            "alignmentMs": 1.5,
            "bytes": 99,
            "slowestTask": "t",
            "reason": None,
        },
    ]
    assert view["runs"] == [
        {"run": 2, "startedAt": 20, "restoredEpoch": 1, "cause": "task viewed/main/src/0 failed"},
        {"run": 1, "startedAt": 1_000_000, "restoredEpoch": None, "cause": "start"},
    ]
    assert view["failures"] == [
        {"at": 20, "run": 1, "taskId": "viewed/main/src/0", "error": "Traceback ...\nValueError: bad"}
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"recordsIn": -1}, "recordsIn must be a whole number >= 0, not -1"),
        ({"idleMs": "5"}, "idleMs must be a whole number >= 0, not '5'"),
        ({"watermark": 1.5}, "watermark must be a whole number or null, not 1.5"),
        ({"channels": []}, "channels must be an object"),
    ],
)
def test_a_stats_body_of_the_wrong_shape_is_refused_naming_its_field(body, message):
    with pytest.raises(ValueError) as refused:
        TaskStats.from_json(body)
    assert str(refused.value) == message


def test_the_page_is_open_the_view_needs_the_secret_and_nothing_climbs_out_of_the_files():
    p = plan()
    secret = guard.new_secret()
    task = p.task_ids()[0]

    async def scenario() -> dict[str, object]:
        routes = CoordinatorRoutes(p.task_ids(), guard.Guard(secret), JobHistory(p))
        seen: dict[str, object] = {}
        async with serving(routes) as url, aiohttp.ClientSession() as session:
            for path in ("/dashboard/", "/dashboard/dashboard.js", "/dashboard/vendor/cytoscape.min.js"):
                async with session.get(url + path) as resp:
                    seen[path] = (resp.status, len(await resp.read()) > 0)
            async with session.get(url + "/dashboard", allow_redirects=False) as resp:
                seen["/dashboard"] = (resp.status, resp.headers["Location"])
            for path in (
                "/dashboard/../api/v1/job",
                "/dashboard/%2e%2e/api/v1/job",
                "/dashboard/vendor/",
            ):
                async with session.get(url + path) as resp:
                    seen[path] = resp.status
            seen["refused so far"] = routes.guard.refused
            async with session.get(url + "/api/v1/job") as resp:
                seen["job without secret"] = resp.status
            ok = guard.headers(secret)
            async with session.get(url + "/api/v1/job", headers=ok) as resp:
                seen["job"] = (resp.status, (await resp.json())["job"])
            body = {"taskId": task, "run": 0, "recordsIn": "many"}
            async with session.post(url + "/stats", json=body, headers=ok) as resp:
                seen["bad stats"] = (resp.status, await resp.text())
        return seen

    seen = asyncio.run(scenario())
    assert seen == {
        "/dashboard/": (200, True),
        "/dashboard/dashboard.js": (200, True),
        "/dashboard/vendor/cytoscape.min.js": (200, True),
        "/dashboard": (302, "/dashboard/"),
        "/dashboard/../api/v1/job": 401,  # normalised to /api/v1/job, which needs the secret
        "/dashboard/%2e%2e/api/v1/job": 401,
        "/dashboard/vendor/": 403,  # no listing
        "refused so far": 2,
        "job without secret": 401,
        "job": (
            200,
            {
                "jobId": "viewed",
                "pipelineId": "main",
                "planVersion": 1,
                "semanticMode": "STRICT_EXACTLY_ONCE",
                "state": "starting",
            },
        ),
        "bad stats": (400, "recordsIn must be a whole number >= 0, not 'many'"),
    }


def test_the_vendored_libraries_are_the_pinned_builds():
    """scripts/vendor-dashboard.sh wrote them from dashboard/package-lock.json; nobody edited them since."""
    vendor = DASHBOARD_FILES / "vendor"
    sums = dict(reversed(line.split("  ", 1)) for line in (vendor / "SHA256SUMS").read_text().splitlines())
    files = sorted(p.name for p in vendor.iterdir() if p.name != "SHA256SUMS")
    assert sorted(sums) == files
    for name, digest in sums.items():
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name
    banner = (vendor / "cytoscape-dagre.min.js").read_text()[:200]
    assert "cytoscape-dagre" in banner
    assert Path(DASHBOARD_FILES / "index.html").read_text().count("vendor/") == 4
