"""The built-in joins (interval, temporal, window; every `how`), against plain Python over the same files.

Both inputs are one JSON-lines file each (one stripe: one split), out of order within DELAY
and one record in 25 from 0.1 to 3 s behind. A record's mark is its file's watermark before
it; what is late, and so every joined row, follows from the files alone, the same at every
parallelism and in task processes or one process (docs/joins.md, docs/time.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from nopstream.connectors.stripes import STRIPE_BYTES
from tests.runtime.conftest import marked_stripes, multiset, read_outputs, run_example, run_job

MIN = -(2**63)
DELAY = 200
LOWER, UPPER = -300, 500
SIZE, SLIDE, GAP = 1000, 500, 400
Row = dict[str, Any]


def stream(seed: int, n: int, step: int, make: Callable[[random.Random], Row]) -> list[Row]:
    """Records in rising time, `step` ms apart, out of order within DELAY, one in 25 behind by 0.1-3 s
    (late when behind its file's highest timestamp so far by DELAY or more)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ts = 10_000 + i * step + rng.randrange(-DELAY + 1, 1)
        if i % 25 == 24:
            ts -= rng.randrange(DELAY // 2, 3_000)
        out.append({"id": f"{seed}-{i}", "customer": f"c{rng.randrange(30)}", "ts": ts, **make(rng)})
    return out


ORDERS = stream(1, 2000, 11, lambda rng: {"amount": rng.randrange(1, 500)})
TIERS = stream(2, 900, 24, lambda rng: {"tier": rng.choice(["bronze", "silver", "gold"])})


def marks(records: list[Row]) -> list[int]:
    """Each record's mark: its file's watermark (highest timestamp so far - DELAY) before it."""
    top, out = MIN, []
    for r in records:
        out.append(MIN if top == MIN else top - DELAY)
        top = max(top, r["ts"])
    return out


def on_time(records: list[Row]) -> list[Row]:
    """The records not at or behind their mark."""
    return [r for r, m in zip(records, marks(records), strict=True) if r["ts"] > m]


def late(records: list[Row]) -> list[Row]:
    return [r for r, m in zip(records, marks(records), strict=True) if r["ts"] <= m]


def pair(key: str, left: Row | None, right: Row | None, **window: int) -> Row:
    return {"key": key, **window, "left": left, "right": right}


def interval(how: str) -> list[Row]:
    lefts, rights = on_time(ORDERS), on_time(TIERS)
    rows: list[Row] = []
    matched_left: set[str] = set()
    matched_right: set[str] = set()
    for lo in lefts:
        for r in rights:
            if lo["customer"] == r["customer"] and LOWER <= r["ts"] - lo["ts"] <= UPPER:
                matched_left.add(lo["id"])
                matched_right.add(r["id"])
                if how not in ("semi", "anti"):
                    rows.append(pair(lo["customer"], lo, r))
    if how == "semi":
        return [lo for lo in lefts if lo["id"] in matched_left]
    if how in ("left", "full", "anti"):
        rows += [
            lo if how == "anti" else pair(lo["customer"], lo, None)
            for lo in lefts
            if lo["id"] not in matched_left
        ]
    if how in ("right", "full"):
        rows += [pair(r["customer"], None, r) for r in rights if r["id"] not in matched_right]
    return rows


def temporal(how: str) -> list[Row]:
    rows = []
    versions = list(enumerate(on_time(TIERS)))
    for lo in on_time(ORDERS):
        valid = [
            (v["ts"], i, v) for i, v in versions if v["customer"] == lo["customer"] and v["ts"] <= lo["ts"]
        ]
        if valid:
            rows.append(pair(lo["customer"], lo, max(valid, key=lambda t: t[:2])[2]))
        elif how == "left":
            rows.append(pair(lo["customer"], lo, None))
    return rows


def windows_of(kind: str, ts: int) -> list[tuple[int, int]]:
    if kind == "tumbling":
        return [(ts - ts % SIZE, ts - ts % SIZE + SIZE)]
    last = ts - ts % SLIDE
    return [(s, s + SIZE) for s in range(last, ts - SIZE, -SLIDE)]


def window_groups(kind: str) -> dict[tuple[str, int, int], tuple[list[Row], list[Row]]]:
    """(key, start, end) -> the window's left and right records.

    Tumbling and sliding windows skip those ending at or behind a record's mark; sessions
    gather the on-time records of both inputs, merging while the next is within GAP.
    """
    groups: dict[tuple[str, int, int], tuple[list[Row], list[Row]]] = {}
    if kind != "session":
        for side, records in enumerate((ORDERS, TIERS)):
            for r, m in zip(records, marks(records), strict=True):
                for start, end in windows_of(kind, r["ts"]):
                    if end - 1 > m:
                        groups.setdefault((r["customer"], start, end), ([], []))[side].append(r)
        return groups
    tagged = sorted(
        (
            (r["customer"], r["ts"], side, r)
            for side, records in enumerate((ORDERS, TIERS))
            for r in on_time(records)
        ),
        key=lambda t: (t[0], t[1]),
    )
    current: list[Any] = []  # key, start, end, lefts, rights
    for key, ts, side, r in tagged:
        if not current or key != current[0] or ts >= current[2]:
            if current:
                groups[(current[0], current[1], current[2])] = (current[3], current[4])
            current = [key, ts, ts, [], []]
        current[2] = max(current[2], ts + GAP)
        current[3 + side].append(r)
    groups[(current[0], current[1], current[2])] = (current[3], current[4])
    return groups


def window(kind: str, how: str) -> list[Row]:
    rows: list[Row] = []
    for (key, start, end), (lefts, rights) in window_groups(kind).items():
        span = {"start": start, "end": end}
        if how == "semi":
            rows += lefts if rights else []
        elif how == "anti":
            rows += [] if rights else lefts
        else:
            rows += [pair(key, lo, r, **span) for lo in lefts for r in rights]
            if how in ("left", "full") and not rights:
                rows += [pair(key, lo, None, **span) for lo in lefts]
            if how in ("right", "full") and not lefts:
                rows += [pair(key, None, r, **span) for r in rights]
    return rows


def window_late(kind: str) -> list[Row]:
    """Records of both inputs late for a window join: every window of theirs ends at or behind the mark."""
    if kind == "session":
        return late(ORDERS) + late(TIERS)
    return [
        r
        for records in (ORDERS, TIERS)
        for r, m in zip(records, marks(records), strict=True)
        if all(end - 1 <= m for _, end in windows_of(kind, r["ts"]))
    ]


def joins_job(joins: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Both files into one join operator per entry, each to its own sink, late records to another."""
    events = {"timestampField": "ts", "maxOutOfOrdernessMs": DELAY}
    file = {"type": "file", "watermark": events}
    return {
        "sources": [
            {"id": "orders", **file, "config": {"path": "in/orders.jsonl", "format": "jsonl"}},
            {"id": "tiers", **file, "config": {"path": "in/tiers.jsonl", "format": "jsonl"}},
        ],
        "operators": [
            {
                "id": name,
                "type": "join",
                "inputs": ["orders", "tiers"],
                "key": {"field": "customer"},
                "join": spec | {"lateOutput": "late"},
            }
            for name, spec in joins.items()
        ],
        "sinks": [
            {"id": f"{name}-out", "inputs": [name], "type": "file", "config": {"path": name}}
            for name in joins
        ]
        + [
            {
                "id": f"{name}-late",
                "inputs": [f"{name}:late"],
                "type": "file",
                "config": {"path": f"{name}-late"},
            }
            for name in joins
        ],
    }


INPUTS = {"orders.jsonl": ORDERS, "tiers.jsonl": TIERS}
PACE = """
    import time

    def pace(record):
        time.sleep(0.001)
        return record
"""
HOWS = ("inner", "left", "right", "full", "semi", "anti")


@pytest.mark.parametrize("parallelism", [1, 3])
def test_interval_and_temporal_joins_give_exactly_the_rows_of_their_definition(tmp_path, mode, parallelism):
    joins = {
        f"interval-{how}": {"kind": "interval", "how": how, "lowerMs": LOWER, "upperMs": UPPER}
        for how in HOWS
    }
    joins |= {f"temporal-{how}": {"kind": "temporal", "how": how} for how in ("inner", "left")}
    out = run_job(tmp_path, joins_job(joins), mode=mode, inputs=INPUTS, parallelism=parallelism)
    assert len(late(ORDERS)) > 50 and len(late(TIERS)) > 20
    for how in HOWS:
        want = interval(how)
        assert len(want) > 300, how
        assert multiset(out[f"interval-{how}-out"]) == multiset(want), how
    for how in ("inner", "left"):
        assert multiset(out[f"temporal-{how}-out"]) == multiset(temporal(how)), how
    assert len(temporal("left")) - len(temporal("inner")) > 20
    for name in joins:
        assert multiset(out[f"{name}-late"]) == multiset(late(ORDERS) + late(TIERS)), name


@pytest.mark.parametrize("parallelism", [1, 3])
def test_window_joins_give_exactly_the_rows_of_their_definition(tmp_path, mode, parallelism):
    cases = [("tumbling", "inner"), ("tumbling", "full"), ("sliding", "left"), ("sliding", "semi")]
    cases += [("session", "right"), ("session", "anti")]
    sizes = {
        "tumbling": {"sizeMs": SIZE},
        "sliding": {"sizeMs": SIZE, "slideMs": SLIDE},
        "session": {"gapMs": GAP},
    }
    joins = {
        f"{kind}-{how}": {"kind": "window", "how": how, "window": {"kind": kind, **sizes[kind]}}
        for kind, how in cases
    }
    out = run_job(tmp_path, joins_job(joins), mode=mode, inputs=INPUTS, parallelism=parallelism)
    for kind, how in cases:
        want = window(kind, how)
        assert len(want) > 100, (kind, how)
        assert multiset(out[f"{kind}-{how}-out"]) == multiset(want), (kind, how)
    for kind, how in cases:
        assert multiset(out[f"{kind}-{how}-late"]) == multiset(window_late(kind)), (kind, how)
    assert len(window_late("tumbling")) > 20


def test_an_outer_interval_join_holds_the_watermark_back_for_the_rows_it_emits_behind_it(tmp_path, mode):
    """A left join's unmatched rows leave when the watermark is UPPER past them: counted downstream
    in event-time windows, none is late, because the join passes on a watermark held back by UPPER."""
    model = joins_job({"j": {"kind": "interval", "how": "left", "lowerMs": LOWER, "upperMs": UPPER}})
    # paced sources move the watermark in many small steps, so rows behind it would be late downstream
    model["operators"][0]["inputs"] = ["pace-orders", "pace-tiers"]
    model["operators"] += [
        {"id": f"pace-{source}", "type": "map", "inputs": [source], "fn": "jobfns:pace"}
        for source in ("orders", "tiers")
    ]
    model["operators"].append(
        {
            "id": "count",
            "type": "window",
            "inputs": ["j"],
            "key": {"field": "key"},
            "aggregate": "count",
            "window": {"kind": "tumbling", "time": "event", "sizeMs": SIZE, "lateOutput": "late"},
        }
    )
    model["sinks"] = [
        {"id": "counts", "inputs": ["count"], "type": "file", "config": {"path": "counts"}},
        {"id": "late", "inputs": ["count:late"], "type": "file", "config": {"path": "late"}},
    ]
    out = run_job(tmp_path, model, mode=mode, fns=PACE, inputs=INPUTS, parallelism=2)
    want: dict[tuple[str, int], int] = {}
    for row in interval("left"):
        ts = max(row["left"]["ts"], row["right"]["ts"]) if row["right"] else row["left"]["ts"]
        window = (row["key"], ts - ts % SIZE)
        want[window] = want.get(window, 0) + 1
    assert out["late"] == []
    assert {(c["key"], c["start"]): c["value"] for c in out["counts"]} == want


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_the_enrichment_example_gives_each_order_the_tier_of_its_time(tmp_path, mode, parallelism):
    data = run_example(tmp_path, "enrichment", parallelism=parallelism, mode=mode)
    orders = marked_stripes(data / "orders.jsonl", 2000)
    tiers = marked_stripes(data / "tiers.jsonl", 2000)
    versions = [(t["ts"], i, t) for i, (t, mark) in enumerate(tiers) if t["ts"] > mark]
    want = []
    for order, mark in orders:
        if order["ts"] > mark:
            valid = [v for v in versions if v[2]["customer"] == order["customer"] and v[0] <= order["ts"]]
            want.append({**order, "tier": max(valid, key=lambda v: v[:2])[2]["tier"] if valid else None})
    late = [r for r, mark in orders + tiers if r["ts"] <= mark]
    assert len(late) > 50 and sum(1 for r in want if r["tier"] is None) > 10
    out = tmp_path / "out" / "enrichment"
    assert multiset(read_outputs(out / "enriched")) == multiset(want)
    assert multiset(read_outputs(out / "late")) == multiset(late)


@pytest.mark.parametrize("parallelism", [1, 3])
def test_a_temporal_join_with_a_ttl_joins_a_version_only_within_it(tmp_path, mode, parallelism):
    ttl = 400
    model = joins_job({"t": {"kind": "temporal", "how": "left"}})
    model["operators"][0]["stateTtlMs"] = ttl
    out = run_job(tmp_path, model, mode=mode, inputs=INPUTS, parallelism=parallelism)
    want = [
        row
        if row["right"] is None or row["left"]["ts"] < row["right"]["ts"] + ttl
        else {**row, "right": None}
        for row in temporal("left")
    ]
    expired = sum(1 for row, kept in zip(temporal("left"), want, strict=True) if row != kept)
    assert expired > 300, expired
    assert multiset(out["t-out"]) == multiset(want)


def test_every_join_gives_the_same_rows_at_every_source_parallelism_and_in_every_run(tmp_path):
    """Both files of several stripes (splits), read at source parallelism 1, 2 and 4, three times at 2
    and once in one process: every run commits the same multiset of rows and late records."""
    inputs = {
        "orders.jsonl": stream(3, 12_000, 11, lambda rng: {"amount": rng.randrange(1, 500)}),
        "tiers.jsonl": stream(4, 8000, 16, lambda rng: {"tier": rng.choice(["bronze", "silver", "gold"])}),
    }
    joins = {
        "interval": {"kind": "interval", "how": "full", "lowerMs": LOWER, "upperMs": UPPER},
        "temporal": {"kind": "temporal", "how": "left"},
        "session": {"kind": "window", "how": "left", "window": {"kind": "session", "gapMs": GAP}},
    }
    runs: list[dict[str, list[Any]]] = []
    for i, (source_parallelism, mode) in enumerate(
        [
            (1, "processes"),
            (2, "processes"),
            (2, "processes"),
            (2, "processes"),
            (4, "processes"),
            (4, "in-process"),
        ]
    ):
        model = joins_job(joins)
        for source in model["sources"]:
            source["parallelism"] = source_parallelism
        (tmp_path / f"run{i}").mkdir()
        runs.append(run_job(tmp_path / f"run{i}", model, mode=mode, inputs=inputs, parallelism=2))
    assert all((tmp_path / "run0" / "in" / name).stat().st_size > 2 * STRIPE_BYTES for name in inputs)
    first = {sink: multiset(records) for sink, records in runs[0].items()}
    for i, run in enumerate(runs[1:], start=1):
        for sink, records in run.items():
            assert multiset(records) == first[sink], f"run {i}: {sink}"
    assert all(len(first[f"{name}-out"]) > 1000 for name in joins) and len(first["interval-late"]) > 300
