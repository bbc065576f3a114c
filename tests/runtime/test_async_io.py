"""The async operator against a real HTTP service (`tests/lookup_server.py`) whose latency and
failures the test sets: ordered output in input order, unordered output as calls complete but
never across a watermark, `capacity` bounding what the service sees in flight, time-outs with
a fallback, retries of a predicate's failures, the rest dead-lettered or failing the run."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from tests.conftest import after_dashboard_line, run_nopstream
from tests.lookup_server import FNS, LookupServer, lookup_server
from tests.runtime.conftest import multiset, read_outputs, run_job


def lookup_job(
    spec: dict[str, Any], *, on_error: str | None = None, watermark: bool = False
) -> dict[str, Any]:
    """Records of in/records.jsonl, each given its score by `jobfns:score` (async), into `out`."""
    source: dict[str, Any] = {
        "id": "records",
        "type": "file",
        "config": {"path": "in/records.jsonl", "format": "jsonl"},
    }
    if watermark:
        source["watermark"] = {"timestampField": "ts", "maxOutOfOrdernessMs": 0}
    op = {"id": "scored", "type": "async_map", "inputs": ["records"], "fn": "jobfns:score", "async": spec}
    if on_error:
        op["onError"] = on_error
    sinks = [{"id": "out", "type": "file", "inputs": ["scored"], "config": {"path": "out"}}]
    if on_error == "dead-letter":
        sinks.append(
            {"id": "bad", "type": "file", "inputs": ["scored:dead-letter"], "config": {"path": "bad"}}
        )
    return {"sources": [source], "operators": [op], "sinks": sinks}


def scored(n: int, **extra: Any) -> dict[str, Any]:
    return {"id": n, **extra, "score": n * 7 % 100}


def test_ordered_results_keep_input_order_and_capacity_bounds_what_is_in_flight(tmp_path):
    rng = random.Random(5)
    delays = [rng.uniform(0.001, 0.008) for _ in range(3000)]
    with lookup_server(LookupServer(latency=lambda n: delays[n])) as server:
        records = [{"id": n} for n in range(3000)]
        fns = FNS.format(url=server.url)
        out = run_job(
            tmp_path,
            lookup_job({"capacity": 8}),
            mode="processes",
            fns=fns,
            inputs={"records.jsonl": records},
            parallelism=1,
        )
    assert out["out"] == [scored(n) for n in range(3000)]  # in order, across the epochs' files
    assert 2 <= server.most_in_flight <= 8, server.most_in_flight
    assert set(server.requests.values()) == {1}  # no failure: each looked up once


def test_unordered_results_come_as_they_complete_but_never_across_a_watermark(tmp_path, mode):
    # later records answer sooner: completion order is the reverse of input order within a batch
    with lookup_server(LookupServer(latency=lambda n: 0.02 - (n % 100) * 0.0002)) as server:
        records = [{"id": n, "ts": n * 10} for n in range(2000)]
        model = lookup_job({"capacity": 100, "ordered": False}, watermark=True)
        model["operators"].append(
            {
                "id": "per-second",
                "type": "window",
                "inputs": ["scored"],
                "key": {"field": "score"},
                "aggregate": "count",
                "window": {"kind": "tumbling", "time": "event", "sizeMs": 1000, "lateOutput": "late"},
            }
        )
        model["sinks"] += [
            {"id": "counts", "type": "file", "inputs": ["per-second"], "config": {"path": "counts"}},
            {"id": "late", "type": "file", "inputs": ["per-second:late"], "config": {"path": "late"}},
        ]
        fns = FNS.format(url=server.url)
        out = run_job(tmp_path, model, mode=mode, fns=fns, inputs={"records.jsonl": records}, parallelism=1)
    assert multiset(out["out"]) == multiset([scored(n, ts=n * 10) for n in range(2000)])
    assert out["out"] != sorted(out["out"], key=lambda r: r["id"])  # they did come as completed
    assert out["late"] == []  # no result behind a watermark it had been sent before
    want = Counter((n * 7 % 100, n * 10 // 1000 * 1000) for n in range(2000))
    assert Counter({(r["key"], r["start"]): r["value"] for r in out["counts"]}) == want


def test_time_outs_fall_back_retries_recover_and_what_still_fails_is_set_aside(tmp_path, mode):
    spec = {
        "capacity": 20,
        "timeoutMs": 300,
        "retries": 2,
        "backoffMs": 10,
        "retryOn": "jobfns:is_server_error",
        "onTimeout": "jobfns:no_score",
    }
    server = LookupServer(failing={10, 60, 110}, flaky={11, 61, 111}, slow={12, 62})
    with lookup_server(server):
        fns = FNS.format(url=server.url)
        records = [{"id": n} for n in range(150)]
        out = run_job(
            tmp_path,
            lookup_job(spec, on_error="dead-letter"),
            mode=mode,
            fns=fns,
            inputs={"records.jsonl": records},
            parallelism=2,
        )
    good = [scored(n) for n in range(150) if n not in server.failing | server.slow]
    assert multiset(out["out"]) == multiset(good + [{"id": n, "score": None} for n in sorted(server.slow)])
    assert [(r["operator"], r["record"]) for r in sorted(out["bad"], key=lambda r: r["record"]["id"])] == [
        ("scored", {"id": n}) for n in sorted(server.failing)
    ]
    assert {r["error"].split(",", 1)[0] for r in out["bad"]} == {"ClientResponseError: 500"}
    assert all(r["at"] and r["at"].endswith("in score") for r in out["bad"])
    # a failing id tried three times, a flaky one twice, a slow one once (the predicate retries
    # server errors only: its time-out goes to the fallback at once)
    assert {n: server.requests[n] for n in sorted(server.failing | server.flaky | server.slow)} == {
        10: 3,
        11: 2,
        12: 1,
        60: 3,
        61: 2,
        62: 1,
        110: 3,
        111: 2,
    }


def test_a_call_that_keeps_timing_out_fails_the_run_naming_the_operator(tmp_path):
    with lookup_server(LookupServer(slow={3})) as server:
        (tmp_path / "in").mkdir()
        (tmp_path / "in" / "records.jsonl").write_text("".join(f'{{"id": {n}}}\n' for n in range(5)))
        (tmp_path / "jobfns.py").write_text(FNS.format(url=server.url))
        job = {
            "jobId": "slow",
            "parallelism": 1,
            "model": lookup_job({"timeoutMs": 200, "retries": 1, "backoffMs": 0}),
        }
        (tmp_path / "job.yaml").write_text(json.dumps(job))
        result = run_nopstream("run", "job.yaml", "--max-restarts", "0", cwd=tmp_path)
    assert result.code == 3, result.err
    last = after_dashboard_line(result.err).strip().splitlines()[-1]
    assert last == (
        "operator 'scored' (async_map) failed: AsyncTimeout: no result within 200 ms (2 attempts)"
    )
    assert read_outputs(Path(tmp_path / "out")) == []


STUBBORN_FNS = """
import asyncio

_left = []


async def _stubborn():
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # takes its cancellation for something else, as a pool's worker once did


async def score(record):
    if not _left:
        _left.append(asyncio.get_running_loop().create_task(_stubborn()))
    return {**record, "score": record["id"] * 7 % 100}
"""


def test_a_task_that_swallows_its_cancellation_does_not_keep_a_finished_task_process_alive(tmp_path):
    """A task process ends its loop as `asyncio.run` would, but gives the tasks left
    `lifetime.LEFT_TASKS_GRACE_S` (5 s) to end once cancelled (`lifetime.run_to_end`): under
    `asyncio.run` this job's task process never exits."""
    import time

    records = [{"id": n} for n in range(200)]
    started = time.monotonic()
    out = run_job(
        tmp_path,
        lookup_job({"capacity": 4}),
        mode="processes",
        fns=STUBBORN_FNS,
        inputs={"records.jsonl": records},
        parallelism=2,
    )
    assert multiset(out["out"]) == multiset([scored(n) for n in range(200)])
    assert time.monotonic() - started < 60
