"""A keyed process of two inputs (Flink's connect + KeyedCoProcessFunction): orders enriched with the
customer's tier valid at the order's time, each input keyed by its own field into one key space.

The function holds each order until event time reaches it (a timer at its timestamp), then joins
the latest tier update at or before it; a record behind its mark is late (`ctx.timestamp <=
ctx.watermark`) and dropped. The expected output is computed from the files in plain Python, and
is the same at every parallelism: what the function sees in `on_timer` depends on the data only.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.chaos import jobs
from tests.runtime.conftest import multiset, run_job

MIN = -(2**63)
DELAY = 200
FNS = jobs.ENRICH  # the chaos cell `enrichment` runs the same function


def stream(seed: int, n: int, make) -> list[dict[str, Any]]:
    """Records in rising time, out of order within DELAY, one in 30 from 1 to 3 s behind (late)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ts = 10_000 + i * 11 + rng.randrange(-DELAY + 1, 1)
        if i % 30 == 29:
            ts -= rng.randrange(1_000, 3_000)
        out.append({"id": f"{seed}-{i}", "customer": f"c{rng.randrange(40)}", "ts": ts, **make(rng)})
    return out


def marked(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], bool]]:
    """Each record and whether it is late: behind its file's (one stripe's) watermark before it."""
    top, out = MIN, []
    for r in records:
        out.append((r, top != MIN and r["ts"] <= top - DELAY))
        top = max(top, r["ts"])
    return out


def expected(orders, tiers) -> list[dict[str, Any]]:
    versions: dict[str, list[tuple[int, str]]] = {}
    out: list[dict[str, Any]] = []
    for t, late in marked(tiers):
        if late:
            out.append({"late": "tiers", "id": t["id"]})
        else:
            versions.setdefault(t["customer"], []).append((t["ts"], t["tier"]))
    for o, late in marked(orders):
        if late:
            out.append({"late": "orders", "id": o["id"]})
            continue
        valid = sorted(v for v in versions.get(o["customer"], []) if v[0] <= o["ts"])
        out.append({**o, "tier": valid[-1][1] if valid else None})
    return out


@pytest.mark.parametrize("parallelism", [1, 3])
def test_orders_get_the_tier_valid_at_their_time(tmp_path, mode, parallelism):
    orders = stream(1, 3000, lambda rng: {"amount": rng.randrange(1, 500)})
    tiers = stream(2, 1200, lambda rng: {"tier": rng.choice(["bronze", "silver", "gold"])})
    events = {"timestampField": "ts", "maxOutOfOrdernessMs": DELAY}
    model = {
        "sources": [
            {
                "id": "orders",
                "type": "file",
                "config": {"path": "in/orders.jsonl", "format": "jsonl"},
                "watermark": events,
            },
            {
                "id": "tiers",
                "type": "file",
                "config": {"path": "in/tiers.jsonl", "format": "jsonl"},
                "watermark": events,
            },
        ],
        "operators": [
            {
                "id": "enrich",
                "type": "process",
                "inputs": ["orders", "tiers"],
                "keys": [{"field": "customer"}, {"field": "customer"}],
                "fn": "jobfns:Enrich",
            }
        ],
        "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
    }
    inputs = {"orders.jsonl": orders, "tiers.jsonl": tiers}
    out = run_job(tmp_path, model, mode=mode, fns=FNS, inputs=inputs, parallelism=parallelism)
    want = expected(orders, tiers)
    assert sum(1 for r in want if "late" in r) > 100 and sum(1 for r in want if r.get("tier")) > 2000
    assert multiset(out["out"]) == multiset(want)
