"""Windows (tumbling, sliding, session; event and processing time), process and CEP.

Event-time inputs come from one file of one stripe (one split, one source subtask),
so the watermarks a task sees are fixed: a source emits `max timestamp -
maxOutOfOrderness` after each batch of exactly 1,000 lines, and each record's mark is
the highest timestamp before it in the file minus that. The references below compute,
in plain Python, what the documented semantics give for that sequence, including late
events (judged against each record's mark).
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from tests.runtime.conftest import multiset, run_job

BATCH = 1000
MIN = -(2**63)
FNS = """
def values(key, records):
    return sorted(r["v"] for r in records)

def is_small(r):
    return r["amount"] < 1

def is_mid(r):
    return 1 <= r["amount"] < 500

def is_large(r):
    return r["amount"] >= 500

class Buckets:
    '''Per key and second of event time: the sorted values, emitted by an event timer.'''
    def process(self, r, ctx):
        b = ctx.timestamp // 1000
        ctx.map("buckets").setdefault(str(b), []).append(r["v"])
        ctx.set_value("first", min(ctx.value("first", b), b))
        ctx.register_event_timer(b * 1000 + 999)
        return []

    def on_timer(self, ts, ctx):
        b = ts // 1000
        vals = ctx.map("buckets").pop(str(b))
        return [{"key": ctx.key, "bucket": b, "values": sorted(vals), "first": ctx.value("first")}]
"""


def stream(
    n: int, *, delay: int, seed: int, late_every: int | None = None, late_by: tuple[int, ...] = (4_000,)
) -> list[dict[str, Any]]:
    """Events with rising timestamps, disorder below `delay`, and optionally far-late ones (each of those
    behind by the next of `late_by` in turn)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ts = 1_000 + i * 7 + rng.randrange(-delay + 1, 1)
        if late_every and i % late_every == late_every - 1:
            ts -= late_by[i // late_every % len(late_by)]
        out.append({"k": f"k{rng.randrange(12)}", "v": rng.randrange(100), "ts": ts})
    return out


def watermarks(events: list[dict[str, Any]], delay: int) -> list[int]:
    """The watermark in force while each batch is processed (emitted after the batch before it)."""
    marks, wm, top = [], MIN, MIN
    for b in range(0, len(events), BATCH):
        marks.append(wm)
        top = max([top] + [e["ts"] for e in events[b : b + BATCH]])
        wm = max(wm, top - delay - 1)
    return marks


def record_marks(events: list[dict[str, Any]], delay: int) -> list[int]:
    """Each event's mark: the highest timestamp before it in its split (the file) minus (`delay` + 1)."""
    marks, top = [], MIN
    for e in events:
        marks.append(top - delay - 1 if top != MIN else MIN)
        top = max(top, e["ts"])
    return marks


def event_source(delay: int) -> dict[str, Any]:
    return {
        "id": "src",
        "type": "file",
        "parallelism": 1,
        "config": {"path": "in/events.jsonl", "format": "jsonl"},
        "watermark": {"timestampField": "ts", "maxOutOfOrdernessMs": delay},
    }


def sinks(*names: str) -> list[dict[str, Any]]:
    out = []
    for name in names:
        node, _, output = name.partition(":")
        ref = f"{node}:{output}" if output else node
        out.append(
            {
                "id": f"{node}-{output or 'main'}",
                "type": "file",
                "inputs": [ref],
                "config": {"path": f"out/{node}-{output or 'main'}"},
            }
        )
    return out


def tumbling_reference(events, *, size: int, delay: int, lateness: int):
    """Tumbling event-time sums with allowed lateness: (results, late events)."""
    marks, late_by = watermarks(events, delay), record_marks(events, delay)
    windows: dict[tuple[str, int], list[Any]] = {}
    out, late = [], []

    def emit(k: str, start: int, w: list[Any]) -> None:
        out.append({"key": k, "start": start, "end": start + size, "value": w[0]})
        w[1] = True

    for b, wm in enumerate(marks):
        if b:  # the watermark that arrived before this batch fires and purges
            for (k, start), w in list(windows.items()):
                if start + size - 1 <= wm and not w[1]:
                    emit(k, start, w)
                if start + size - 1 + lateness <= wm:
                    del windows[(k, start)]
        for i in range(b * BATCH, min((b + 1) * BATCH, len(events))):
            e = events[i]
            start = e["ts"] - e["ts"] % size
            if start + size - 1 + lateness <= max(wm, late_by[i]):
                late.append(e)
                continue
            w = windows.setdefault((e["k"], start), [0, False])
            w[0] += e["v"]
            if w[1] or start + size - 1 <= wm:
                emit(e["k"], start, w)
    for (k, start), w in windows.items():
        if not w[1]:
            emit(k, start, w)
    return out, late


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_tumbling_event_time_with_lateness_and_late_output(tmp_path, mode, parallelism):
    events = stream(3500, delay=300, seed=parallelism, late_every=23, late_by=(4_000, 2_000, 1_500, 1_000))
    window = {
        "kind": "tumbling",
        "time": "event",
        "sizeMs": 2000,
        "allowedLatenessMs": 1500,
        "lateOutput": "late",
    }
    model = {
        "sources": [event_source(300)],
        "operators": [
            {
                "id": "win",
                "type": "window",
                "inputs": ["src"],
                "key": {"field": "k"},
                "window": window,
                "aggregate": {"kind": "sum", "field": "v"},
            }
        ],
        "sinks": sinks("win", "win:late"),
    }
    out = run_job(tmp_path, model, mode=mode, inputs={"events.jsonl": events}, parallelism=parallelism)
    results, late = tumbling_reference(events, size=2000, delay=300, lateness=1500)
    assert late, "the data must contain late events"
    fired = [(r["key"], r["start"]) for r in results]
    assert len(fired) > len(set(fired)), "the data must make some window fire again within its lateness"
    assert multiset(out["win-late"]) == multiset(late)
    assert multiset(out["win-main"]) == multiset(results)


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_sliding_and_session_windows(tmp_path, mode, parallelism):
    events = stream(3000, delay=200, seed=10 + parallelism)
    model = {
        "sources": [event_source(200)],
        "operators": [
            {
                "id": "slide",
                "type": "window",
                "inputs": ["src"],
                "key": {"field": "k"},
                "fn": "jobfns:values",
                "window": {"kind": "sliding", "time": "event", "sizeMs": 3000, "slideMs": 1000},
            },
            {
                "id": "session",
                "type": "window",
                "inputs": ["src"],
                "key": {"field": "k"},
                "aggregate": "count",
                "window": {"kind": "session", "time": "event", "gapMs": 90},
            },
        ],
        "sinks": sinks("slide", "session"),
    }
    out = run_job(
        tmp_path, model, mode=mode, fns=FNS, inputs={"events.jsonl": events}, parallelism=parallelism
    )
    sliding: dict[tuple[str, int], list[int]] = defaultdict(list)
    for e in events:
        last = e["ts"] - e["ts"] % 1000
        for start in range(last, e["ts"] - 3000, -1000):
            sliding[(e["k"], start)].append(e["v"])
    expected = [
        {"key": k, "start": s, "end": s + 3000, "value": sorted(vs)} for (k, s), vs in sliding.items()
    ]
    assert multiset(out["slide-main"]) == multiset(expected)
    sessions = []
    by_key: dict[str, list[int]] = defaultdict(list)
    for e in events:
        by_key[e["k"]].append(e["ts"])
    for k, stamps in by_key.items():
        stamps.sort()
        start, end, count = stamps[0], stamps[0] + 90, 1
        for ts in stamps[1:]:
            if ts < end:
                end, count = max(end, ts + 90), count + 1
            else:
                sessions.append({"key": k, "start": start, "end": end, "value": count})
                start, end, count = ts, ts + 90, 1
        sessions.append({"key": k, "start": start, "end": end, "value": count})
    assert multiset(out["session-main"]) == multiset(sessions)


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_processing_time_window_fires_everything_at_end(tmp_path, mode, parallelism):
    events = stream(2000, delay=1, seed=3)
    model = {
        "sources": [{"id": "src", "type": "file", "config": {"path": "in/events.jsonl", "format": "jsonl"}}],
        "operators": [
            {
                "id": "win",
                "type": "window",
                "inputs": ["src"],
                "key": {"field": "k"},
                "aggregate": "count",
                "window": {"kind": "tumbling", "time": "processing", "sizeMs": 86_400_000},
            }
        ],
        "sinks": sinks("win"),
    }
    out = run_job(tmp_path, model, mode=mode, inputs={"events.jsonl": events}, parallelism=parallelism)
    totals: dict[str, int] = defaultdict(int)
    for r in out["win-main"]:
        assert r["end"] - r["start"] == 86_400_000 and r["start"] % 86_400_000 == 0
        totals[r["key"]] += r["value"]
    expected: dict[str, int] = defaultdict(int)
    for e in events:
        expected[e["k"]] += 1
    assert totals == expected


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_process_function_with_state_and_event_timers(tmp_path, mode, parallelism):
    events = stream(3000, delay=150, seed=20 + parallelism)
    model = {
        "sources": [event_source(150)],
        "operators": [
            {
                "id": "buckets",
                "type": "process",
                "inputs": ["src"],
                "key": {"field": "k"},
                "fn": "jobfns:Buckets",
            }
        ],
        "sinks": sinks("buckets"),
    }
    out = run_job(
        tmp_path, model, mode=mode, fns=FNS, inputs={"events.jsonl": events}, parallelism=parallelism
    )
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    first: dict[str, int] = {}
    for e in events:
        groups[(e["k"], e["ts"] // 1000)].append(e["v"])
        first[e["k"]] = min(first.get(e["k"], e["ts"] // 1000), e["ts"] // 1000)
    expected = [
        {"key": k, "bucket": b, "values": sorted(vs), "first": first[k]} for (k, b), vs in groups.items()
    ]
    assert multiset(out["buckets-main"]) == multiset(expected)


def cep_reference(events, steps, within: int, delay: int):
    """The documented NFA over each key's on-time events in timestamp order."""
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e, mark in zip(events, record_marks(events, delay), strict=True):
        if e["ts"] > mark:  # late events are dropped
            by_key[e["card"]].append(e)
    matches = []
    for evs in by_key.values():
        partials: list[list[Any]] = []
        for e in sorted(evs, key=lambda x: x["ts"]):
            kept = []
            for nxt, matched, first_ts, looping in partials:
                if e["ts"] - first_ts > within:
                    continue
                name, where, contiguity, quantifier = steps[nxt]
                if where(e):
                    matched = {**matched, name: [e]}
                    if nxt + 1 == len(steps):
                        matches.append(matched)
                    else:
                        kept.append([nxt + 1, matched, first_ts, quantifier == "oneOrMore"])
                elif looping and steps[nxt - 1][1](e):
                    prev = steps[nxt - 1][0]
                    kept.append([nxt, {**matched, prev: [*matched[prev], e]}, first_ts, True])
                elif contiguity != "strict":
                    kept.append([nxt, matched, first_ts, looping])
            if steps[0][1](e):
                kept.append([1, {steps[0][0]: [e]}, e["ts"], steps[0][3] == "oneOrMore"])
            partials = kept
    return matches


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_cep_patterns_with_out_of_order_and_late_events(tmp_path, mode, parallelism):
    rng = random.Random(parallelism)
    events = []
    for i in range(2600):
        ts = 10_000 + i * 40 + rng.randrange(-399, 1)
        if i % 151 == 150:
            ts -= 20_000  # far behind the watermark: late
        amount = rng.choice([0.5, 0.2, 20.0, 80.0, 600.0, 900.0])
        events.append({"card": f"c{rng.randrange(15)}", "amount": amount, "ts": ts})
    is_small = lambda r: r["amount"] < 1  # noqa: E731
    is_mid = lambda r: 1 <= r["amount"] < 500  # noqa: E731
    is_large = lambda r: r["amount"] >= 500  # noqa: E731
    pattern_a = {
        "steps": [
            {"name": "small", "where": "jobfns:is_small"},
            {"name": "large", "where": "jobfns:is_large"},
        ],
        "withinMs": 3000,
        "time": "event",
    }
    pattern_b = {
        "steps": [
            {"name": "small", "where": "jobfns:is_small"},
            {"name": "mid", "where": "jobfns:is_mid", "quantifier": "oneOrMore", "contiguity": "strict"},
            {"name": "large", "where": "jobfns:is_large", "contiguity": "strict"},
        ],
        "withinMs": 5000,
        "time": "event",
    }
    src = event_source(400)
    src["config"]["path"] = "in/events.jsonl"
    model = {
        "sources": [src],
        "operators": [
            {"id": "probe", "type": "cep", "inputs": ["src"], "key": {"field": "card"}, "pattern": pattern_a},
            {"id": "climb", "type": "cep", "inputs": ["src"], "key": {"field": "card"}, "pattern": pattern_b},
        ],
        "sinks": sinks("probe", "climb"),
    }
    model["sources"][0]["watermark"]["timestampField"] = "ts"
    out = run_job(
        tmp_path, model, mode=mode, fns=FNS, inputs={"events.jsonl": events}, parallelism=parallelism
    )
    steps_a = [("small", is_small, "relaxed", "one"), ("large", is_large, "relaxed", "one")]
    steps_b = [
        ("small", is_small, "relaxed", "one"),
        ("mid", is_mid, "strict", "oneOrMore"),
        ("large", is_large, "strict", "one"),
    ]
    expected_a = cep_reference(events, steps_a, 3000, 400)
    expected_b = cep_reference(events, steps_b, 5000, 400)
    assert expected_a and expected_b
    assert multiset(out["probe-main"]) == multiset(expected_a)
    assert multiset(out["climb-main"]) == multiset(expected_b)


TTL_COUNT = """
class Count:
    def process(self, record, ctx):
        n = ctx.value("n", 0) + 1
        ctx.set_value("n", n)
        return [{"key": record["k"], "id": record["id"], "n": n}]
"""


@pytest.mark.parametrize("parallelism", [1, 3])
def test_a_process_with_an_event_time_ttl_forgets_a_key_its_records_left_for_longer(
    tmp_path, mode, parallelism
):
    """A key's state expires stateTtlMs after its last record, judged by each record's mark: one
    file (one split), so every key's records come in file order and the counts follow from the data."""
    rng = random.Random(12)
    records, ts = [], 10_000
    for i in range(3000):
        ts += rng.choice([3, 5, 8, 400])  # now and then a pause longer than the TTL for many keys
        records.append({"id": i, "k": f"k{rng.randrange(8)}", "ts": ts - rng.randrange(0, 100)})
    ttl, delay = 700, 100
    model = {
        "sources": [
            {
                "id": "src",
                "type": "file",
                "config": {"path": "in/events.jsonl", "format": "jsonl"},
                "watermark": {"timestampField": "ts", "maxOutOfOrdernessMs": delay},
            }
        ],
        "operators": [
            {"id": "count", "type": "process", "key": {"field": "k"}, "fn": "jobfns:Count", "stateTtlMs": ttl}
        ],
        "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
    }
    out = run_job(
        tmp_path, model, mode=mode, fns=TTL_COUNT, inputs={"events.jsonl": records}, parallelism=parallelism
    )
    counts: dict[str, int] = {}
    last: dict[str, int] = {}
    top, want, resets = None, [], 0
    for r in records:
        mark = MIN if top is None else top - delay - 1
        k = r["k"]
        if k in last and last[k] + ttl <= mark:
            del last[k], counts[k]
            resets += 1
        last[k] = max(last.get(k, r["ts"]), r["ts"])
        counts[k] = counts.get(k, 0) + 1
        want.append({"key": k, "id": r["id"], "n": counts[k]})
        top = r["ts"] if top is None else max(top, r["ts"])
    assert resets > 50, resets
    assert multiset(out["out"]) == multiset(want)
