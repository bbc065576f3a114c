"""Event-time results depend on the data only: the same output at every source parallelism.

Clicks of 1,500 users in two JSON-lines files of several stripes each, into session
windows (30 s gap) and tumbling windows (10 s), 5 s out of orderness, late records to
side outputs. Each stripe is a split with its own watermark, and a record is late when
it is behind its own stripe's watermark where it was read (docs/time.md): the test
computes that, and the windows over what is not late, in plain Python from the files'
bytes, and every run at source parallelism 1, 2 and 4, in one process, and three times at 2,
must give exactly it. Before per-split marks these runs gave different sessions and late
records at each parallelism (issue 31's finding).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from typing import Any

import pytest

from nopstream.connectors.stripes import STRIPE_BYTES
from tests.runtime.conftest import multiset, run_job

MIN = -(2**63)
DELAY, GAP, SIZE = 5_000, 30_000, 10_000


def clicks(seed: int, n: int) -> list[dict[str, Any]]:
    """Clicks in rising time, up to DELAY out of order, one in 40 from 8 to 60 s behind."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ts = 1_700_000_000_000 + i * 40 + rng.randrange(-DELAY + 1, 1)
        if rng.random() < 1 / 40:
            ts -= rng.randrange(8_000, 60_000)
        out.append({"user": f"u{rng.randrange(1500)}", "page": f"/p{rng.randrange(30)}", "ts": ts})
    return out


def marked(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """Each record with its mark: its stripe's highest timestamp before it minus DELAY (the file as
    `run_job` writes it, one JSON document and a newline a line; a line is in the stripe it starts in)."""
    highs: dict[int, int] = {}
    out, offset = [], 0
    for r in records:
        stripe = offset // STRIPE_BYTES
        high = highs.get(stripe, MIN)
        out.append((r, high - DELAY - 1 if high != MIN else MIN))
        highs[stripe] = max(high, r["ts"])
        offset += len((json.dumps(r) + "\n").encode())
    return out


def expected(files: dict[str, list[dict[str, Any]]]) -> dict[str, list[Any]]:
    """Sessions, tumbling counts and the late records of each, as the documented rules give them."""
    every = [pair for records in files.values() for pair in marked(records)]
    session_late = [r for r, mark in every if r["ts"] <= mark]
    tumbling_late = [r for r, mark in every if r["ts"] - r["ts"] % SIZE + SIZE - 1 <= mark]
    by_user: dict[str, list[int]] = defaultdict(list)
    for r, mark in every:
        if r["ts"] > mark:
            by_user[r["user"]].append(r["ts"])
    sessions = []
    for user, stamps in by_user.items():
        stamps.sort()
        start, end, count = stamps[0], stamps[0] + GAP, 1
        for ts in stamps[1:]:
            if ts < end:
                end, count = max(end, ts + GAP), count + 1
            else:
                sessions.append({"key": user, "start": start, "end": end, "value": count})
                start, end, count = ts, ts + GAP, 1
        sessions.append({"key": user, "start": start, "end": end, "value": count})
    counts: dict[tuple[str, int], int] = defaultdict(int)
    late_ids = {id(r) for r in tumbling_late}
    for r, _ in every:
        if id(r) not in late_ids:
            counts[(r["page"], r["ts"] - r["ts"] % SIZE)] += 1
    pages = [{"key": p, "start": s, "end": s + SIZE, "value": c} for (p, s), c in counts.items()]
    return {
        "sessions": sessions,
        "sessions-late": session_late,
        "pages": pages,
        "pages-late": tumbling_late,
    }


def model(source_parallelism: int) -> dict[str, Any]:
    def sink(name: str, ref: str) -> dict[str, Any]:
        return {"id": f"to-{name}", "type": "file", "inputs": [ref], "config": {"path": f"out/{name}"}}

    def window(op_id: str, key: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": op_id,
            "type": "window",
            "inputs": ["clicks"],
            "key": {"field": key},
            "aggregate": "count",
            "window": {"time": "event", "lateOutput": "late", **spec},
        }

    return {
        "sources": [
            {
                "id": "clicks",
                "type": "file",
                "parallelism": source_parallelism,
                "config": {"path": "in/*.jsonl", "format": "jsonl"},
                "watermark": {"timestampField": "ts", "maxOutOfOrdernessMs": DELAY},
            }
        ],
        "operators": [
            window("sessions", "user", {"kind": "session", "gapMs": GAP}),
            window("pages", "page", {"kind": "tumbling", "sizeMs": SIZE}),
        ],
        "sinks": [
            sink("sessions", "sessions"),
            sink("sessions-late", "sessions:late"),
            sink("pages", "pages"),
            sink("pages-late", "pages:late"),
        ],
    }


@pytest.fixture(scope="module")
def inputs() -> dict[str, list[dict[str, Any]]]:
    files = {"clicks-0.jsonl": clicks(1, 24_000), "clicks-1.jsonl": clicks(2, 16_000)}
    sizes = [sum(len(json.dumps(r)) + 1 for r in records) for records in files.values()]
    assert all(size > 3 * STRIPE_BYTES for size in sizes), "each file must have several stripes"
    return files


@pytest.mark.parametrize(
    ("source_parallelism", "mode"),
    [(1, "processes"), (2, "processes"), (4, "processes"), (2, "in-process"), (4, "in-process")]
    + [pytest.param(2, "processes", id=f"2-processes-again-{n}") for n in (1, 2)],  # three runs at 2
)
def test_late_records_and_windows_depend_on_the_data_only(tmp_path, inputs, source_parallelism, mode):
    want = expected(inputs)
    late = len(want["sessions-late"]), len(want["pages-late"])
    assert min(late) > 500, "the data must have late records"
    out = run_job(tmp_path, model(source_parallelism), mode=mode, inputs=inputs, parallelism=2)
    for name, records in want.items():
        got = out[f"to-{name}"]
        assert multiset(got) == multiset(records), f"{name} at source parallelism {source_parallelism}"
