"""Snapshot and restore of every stateful operator and source reader, through plain data.

For each one: feeding a sequence in one go must give the same output as feeding its
first part, snapshotting (to JSON bytes and back), restoring into a fresh instance,
and feeding the rest. Windows, timers, CEP partial matches and buffers, process state
and watermarks all have to survive the cut.
"""

from __future__ import annotations

import json
import random
import sys
import textwrap
from typing import Any

import orjson
import pytest

from nopstream.connectors.files import file_source
from nopstream.connectors.generator import GeneratorSource
from nopstream.model.load import load_data
from nopstream.plan import compiler
from nopstream.plan.partitioned import ShardRange
from nopstream.records import MAX_TIMESTAMP, Batch
from nopstream.runtime.keyed import ShardCache
from nopstream.runtime.operators.base import Context
from nopstream.runtime.operators.registry import build_operator

FNS = """
def keep_max(acc, r):
    return r if r["v"] > acc["v"] else acc

def values(key, records):
    return sorted(r["v"] for r in records)

def small(r):
    return r["v"] < 20

def large(r):
    return r["v"] >= 80

class Buckets:
    def process(self, r, ctx):
        b = ctx.timestamp // 100
        ctx.map("b").setdefault(str(b), []).append(r["v"])
        ctx.set_value("n", ctx.value("n", 0) + 1)
        ctx.register_event_timer(b * 100 + 99)
        return []

    def on_timer(self, ts, ctx):
        values = sorted(ctx.map("b").pop(str(ts // 100)))
        return [{"k": ctx.key, "b": ts // 100, "vs": values, "n": ctx.value("n")}]

class Count:
    def process(self, r, ctx):
        ctx.set_value("n", ctx.value("n", 0) + 1)
        return [{"k": ctx.key, "n": ctx.value("n")}]
"""

OPERATORS = {
    "aggregate-rolling": {"type": "aggregate", "aggregate": {"kind": "avg", "field": "v"}},
    "aggregate-final": {"type": "aggregate", "aggregate": "count", "emit": "final"},
    "reduce": {"type": "reduce", "fn": "snapfns:keep_max"},
    "tumbling": {
        "type": "window",
        "aggregate": {"kind": "sum", "field": "v"},
        "window": {
            "kind": "tumbling",
            "time": "event",
            "sizeMs": 300,
            "allowedLatenessMs": 200,
            "lateOutput": "late",
        },
    },
    "sliding": {
        "type": "window",
        "fn": "snapfns:values",
        "window": {"kind": "sliding", "time": "event", "sizeMs": 400, "slideMs": 100},
    },
    "session": {
        "type": "window",
        "aggregate": "count",
        "window": {"kind": "session", "time": "event", "gapMs": 25},
    },
    "process": {"type": "process", "fn": "snapfns:Buckets"},
    "process-ttl": {"type": "process", "fn": "snapfns:Count", "stateTtlMs": 150},
    "cep": {
        "type": "cep",
        "pattern": {
            "steps": [{"name": "s", "where": "snapfns:small"}, {"name": "l", "where": "snapfns:large"}],
            "withinMs": 150,
            "time": "event",
        },
    },
}


@pytest.fixture(autouse=True)
def user_functions(tmp_path, monkeypatch):
    (tmp_path / "snapfns.py").write_text(textwrap.dedent(FNS))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("snapfns", None)


def node_of(spec: dict[str, Any]):
    model = {
        "jobId": "snap",
        "model": {
            "sources": [{"id": "src", "type": "generator", "watermark": {"timestampField": "ts"}}],
            "operators": [{"id": "op", "inputs": ["src"], "key": {"field": "k"}, **spec}],
            "sinks": [{"id": "out", "type": "file", "inputs": ["op"], "config": {"path": "o"}}],
        },
    }
    return compiler.compile_model(load_data(model)).partitioned.operators()["op"]


class Harness:
    """One operator instance with a context, collecting main and side outputs."""

    def __init__(self, node) -> None:
        self.side: list[tuple[str, list[Any]]] = []
        ctx = Context(
            node,
            0,
            1,
            ShardRange(0, 128),
            ShardCache(128),
            lambda tag, b: self.side.append((tag, b.records)),
            lambda: 0,
        )
        self.op = build_operator(ctx)
        self.out: list[Any] = []

    def feed(self, steps: list[tuple[str, Any]]) -> None:
        for kind, value in steps:
            result = self.op.on_batch(value, 0) if kind == "batch" else self.op.on_watermark(value)
            if result is not None:
                self.out.extend(result.records)

    def end(self) -> None:
        self.feed([("wm", MAX_TIMESTAMP)])
        result = self.op.on_end()
        if result is not None:
            self.out.extend(result.records)


def script(seed: int) -> list[tuple[str, Any]]:
    """Batches of out-of-order events with a few late ones, and a watermark after each batch."""
    rng = random.Random(seed)
    steps: list[tuple[str, Any]] = []
    top = 0
    for b in range(30):
        records = []
        for i in range(20):
            ts = b * 100 + i * 5 + rng.randrange(-40, 1)
            if rng.random() < 0.05:
                ts -= 400
            records.append({"k": f"k{rng.randrange(4)}", "v": rng.randrange(100), "ts": ts})
        steps.append(("batch", Batch(records, [r["ts"] for r in records])))
        top = max([top] + [r["ts"] for r in records])
        steps.append(("wm", top - 40))
    return steps


def canonical(records: list[Any]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in records)


@pytest.mark.parametrize("name", sorted(OPERATORS))
@pytest.mark.parametrize("cut", [7, 30, 45])
def test_restore_continues_exactly(name, cut):
    node = node_of(OPERATORS[name])
    steps = script(seed=cut)
    whole = Harness(node)
    whole.feed(steps)
    whole.end()
    assert whole.out, "the scenario must produce output"

    first = Harness(node)
    first.feed(steps[:cut])
    state = orjson.loads(orjson.dumps(first.op.snapshot()))
    assert state["schemaVersion"] == 1
    second = Harness(node)
    second.op.restore(state)
    assert orjson.loads(orjson.dumps(second.op.snapshot())) == state  # nothing lost in the round trip
    second.feed(steps[cut:])
    second.end()
    assert canonical(first.out + second.out) == canonical(whole.out)
    assert sorted(map(str, first.side + second.side)) == sorted(map(str, whole.side))


def test_a_snapshot_leaves_out_the_keys_whose_ttl_ran_out_by_the_watermark():
    h = Harness(node_of(OPERATORS["process-ttl"]))
    records = [{"k": "old", "ts": 100}, {"k": "edge", "ts": 750}, {"k": "new", "ts": 800}]
    h.feed([("batch", Batch(records, [r["ts"] for r in records])), ("wm", 900)])
    state = orjson.loads(orjson.dumps(h.op.snapshot()))
    tables = [t for shard in state["keyed"].values() for t in shard.values()]
    assert sorted(key for table in tables for key, _ in table) == ["new", "new"]  # 750 + 150 <= 900


def test_file_source_resumes_at_its_cursor(tmp_path):
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text("".join(f"file{i} line{j}\n" for j in range(2500)))
    config = {"path": str(tmp_path / "*.txt")}
    whole = file_source(config, subtask=0, parallelism=1)
    expected = []
    while (batch := whole.read(1000)) is not None:
        expected.extend(batch.records)
    first = file_source(config, subtask=0, parallelism=1)
    got = []
    for _ in range(4):
        got.extend(first.read(1000).records)
    state = orjson.loads(orjson.dumps(first.snapshot()))
    first.close()
    second = file_source(config, subtask=0, parallelism=1)
    second.restore(state)
    while (batch := second.read(1000)) is not None:
        got.extend(batch.records)
    assert got == expected and len(expected) == 7500


def test_generator_resumes_at_its_cursor():
    config = {"kind": "words", "count": 5000, "seed": 3}
    whole = GeneratorSource(config, ("split-0", "split-2"), total_splits=3)
    expected = []
    while (batch := whole.read(700)) is not None:
        expected.extend(batch.records)
    first = GeneratorSource(config, ("split-0", "split-2"), total_splits=3)
    got = first.read(700).records + first.read(700).records
    second = GeneratorSource(config, ("split-0", "split-2"), total_splits=3)
    second.restore(orjson.loads(orjson.dumps(first.snapshot())))
    while (batch := second.read(700)) is not None:
        got.extend(batch.records)
    assert got == expected and len(expected) == len(range(0, 5000, 3)) + len(range(2, 5000, 3))
