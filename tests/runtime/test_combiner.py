"""Local pre-aggregation before the shuffle: fewer records cross, the results stay exact.

The exactness of every final aggregate and reduce with the combiner on is shown by
`test_keyed.py` (it is on by default there) and under kills by the chaos cell
`final-count`; here: that it really combines, that `combine: false` turns it off, and
that partials stay exact through a recovery from an epoch taken while they were held.
"""

from __future__ import annotations

import random
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import yaml

from nopstream.local import runner
from nopstream.model.load import load_file
from nopstream.plan import compiler
from nopstream.plan.partitioned import Edge
from nopstream.plan.streamgraph import EdgePolicy, KeySelector, StreamNode
from nopstream.records import Batch
from nopstream.runtime.combiner import Combiner, combines
from tests.conftest import run_nopstream
from tests.runtime.conftest import multiset, read_outputs, run_job, write_jsonl

FNS = """
import time

def split(line):
    time.sleep(SLEEP)
    return line.split()

def word(w):
    return w
"""
WORDS = 200


def corpus(workdir: Path, *, files: int, lines: int, sleep: float = 0.0) -> Counter[str]:
    """Lines of 6 words of `WORDS` into `in/`, split at `sleep` seconds a line; each word's count."""
    rng = random.Random(7)
    vocabulary = [f"w{i}" for i in range(WORDS)]
    counts: Counter[str] = Counter()
    (workdir / "in").mkdir(parents=True)
    for f in range(files):
        text = [rng.choices(vocabulary, k=6) for _ in range(lines)]
        counts.update(w for line in text for w in line)
        (workdir / "in" / f"part-{f}.txt").write_text("".join(" ".join(line) + "\n" for line in text))
    (workdir / "combinerfns.py").write_text(textwrap.dedent(FNS).replace("SLEEP", str(sleep)))
    return counts


def word_count(workdir: Path, *, parallelism: int, combine: bool | None = None) -> Path:
    count = {"id": "count", "type": "aggregate", "aggregate": "count", "emit": "final"}
    if combine is not None:
        count["combine"] = combine
    spec = {
        "jobId": "combined",
        "parallelism": parallelism,
        "checkpoint": {"intervalMs": 250},
        "model": {
            "sources": [{"id": "lines", "type": "file", "config": {"path": "in/*.txt"}}],
            "operators": [
                {"id": "split", "type": "flat_map", "fn": "combinerfns:split"},
                {"id": "by-word", "type": "key_by", "key": {"fn": "combinerfns:word"}},
                count,
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def expected(counts: Counter[str]) -> Counter[str]:
    return multiset([{"key": w, "value": n} for w, n in counts.items()])


@pytest.mark.parametrize("combine", [None, False])
def test_a_final_count_receives_partials_per_key_not_every_word(tmp_path, monkeypatch, combine):
    counts = corpus(tmp_path, files=4, lines=500)
    monkeypatch.chdir(tmp_path)
    plans = compiler.compile_model(load_file(word_count(tmp_path, parallelism=2, combine=combine)))
    options = runner.RunOptions(quiet=True, workdir=tmp_path / ".nopstream", python_path=(str(tmp_path),))
    result = runner.run_job(plans, options)
    assert multiset(read_outputs(tmp_path / "out")) == expected(counts)
    words = sum(counts.values())
    if combine is False:
        assert result.records_in["count"] == words
    else:
        # each of 2 splitters sends at most one pair per word at each barrier and at the end
        assert result.records_in["count"] < words / 4, result.records_in


def test_partials_held_at_a_durable_epoch_are_neither_lost_nor_doubled_by_a_recovery(tmp_path):
    """A task is killed right after epoch 3 becomes durable, while the splitters read (for about
    4 s): each held partials of records before the barrier, and the source restarts after them."""
    counts = corpus(tmp_path, files=4, lines=3000, sleep=0.001)
    word_count(tmp_path, parallelism=3)
    result = run_nopstream("run", "job.yaml", cwd=tmp_path, env={"NOPSTREAM_FAULTS": "after-durable@3"})
    assert result.code == 0, result.err
    assert "recovering: " in result.err
    assert multiset(read_outputs(tmp_path / "out")) == expected(counts)


def windowed(tmp_path: Path, *, combine: bool | None = None) -> tuple[dict, dict, list[dict]]:
    """Two files of events (disorder below the watermark delay, so nothing is late), a tumbling sum
    and a sliding average per key; (model, inputs, expected records of both windows)."""
    rng = random.Random(3)
    inputs: dict[str, list[dict]] = {}
    for f in range(2):
        inputs[f"part-{f}.jsonl"] = [
            {"k": f"k{rng.randrange(30)}", "v": rng.randrange(100), "ts": i * 3 + rng.randrange(0, 40)}
            for i in range(6000)
        ]
    sliding = {"kind": "sliding", "time": "event", "sizeMs": 1500, "slideMs": 500}
    tumbling = {"kind": "tumbling", "time": "event", "sizeMs": 500}
    ops = [
        {"id": "sum", "type": "window", "inputs": ["src"], "key": {"field": "k"},
         "aggregate": {"kind": "sum", "field": "v"}, "window": tumbling},
        {"id": "avg", "type": "window", "inputs": ["src"], "key": {"field": "k"},
         "aggregate": {"kind": "avg", "field": "v"}, "window": sliding},
    ]  # fmt: skip
    for op in ops:
        if combine is not None:
            op["combine"] = combine
    source = {"id": "src", "type": "file", "config": {"path": "in/*.jsonl", "format": "jsonl"},
              "watermark": {"timestampField": "ts", "maxOutOfOrdernessMs": 50}}  # fmt: skip
    model = {
        "sources": [source],
        "operators": ops,
        "sinks": [
            {"id": f"{n}-out", "type": "file", "inputs": [n], "config": {"path": f"out/{n}"}}
            for n in ("sum", "avg")
        ],
    }  # fmt: skip
    sums: dict[tuple[str, int], int] = {}
    values: dict[tuple[str, int], list[int]] = {}
    for e in (e for events in inputs.values() for e in events):
        start = e["ts"] - e["ts"] % 500
        sums[(e["k"], start)] = sums.get((e["k"], start), 0) + e["v"]
        for s in range(start, e["ts"] - 1500, -500):
            values.setdefault((e["k"], s), []).append(e["v"])
    averages = {key: sum(vs) / len(vs) for key, vs in values.items()}
    expected = {
        "sum": [{"key": k, "start": s, "end": s + 500, "value": v} for (k, s), v in sums.items()],
        "avg": [{"key": k, "start": s, "end": s + 1500, "value": v} for (k, s), v in averages.items()],
    }
    return model, inputs, expected


def test_event_time_window_aggregates_are_exact_with_partials_per_window(tmp_path, mode):
    model, inputs, expected = windowed(tmp_path)
    out = run_job(tmp_path, model, mode=mode, inputs=inputs, parallelism=2)
    for name in ("sum", "avg"):
        assert multiset(out[f"{name}-out"]) == multiset(expected[name]), name


def test_window_partials_held_at_a_durable_epoch_are_neither_lost_nor_doubled_by_a_recovery(tmp_path):
    """As for the counts above: a task is killed right after epoch 3 becomes durable, while both
    sources' maps (slowed) hold partials per key and window of records before the barrier."""
    model, inputs, expected = windowed(tmp_path)
    model["operators"].insert(0, {"id": "slow", "type": "map", "inputs": ["src"], "fn": "windowfns:slow"})
    for op in model["operators"][1:]:
        op["inputs"] = ["slow"]
    for name, events in inputs.items():
        write_jsonl(tmp_path / "in" / name, events)
    (tmp_path / "windowfns.py").write_text(
        "import time\n\ndef slow(r):\n    time.sleep(0.0004)\n    return r\n"
    )
    spec = {"jobId": "windows", "parallelism": 2, "checkpoint": {"intervalMs": 250}, "model": model}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_nopstream("run", "job.yaml", cwd=tmp_path, env={"NOPSTREAM_FAULTS": "after-durable@3"})
    assert result.code == 0, result.err
    assert "recovering: " in result.err
    for name in ("sum", "avg"):
        assert multiset(read_outputs(tmp_path / "out" / name)) == multiset(expected[name]), name


@pytest.mark.parametrize("combine", [None, False])
def test_a_window_receives_partials_per_key_and_window_not_every_event(tmp_path, monkeypatch, combine):
    model, inputs, expected = windowed(tmp_path, combine=combine)
    for name, events in inputs.items():
        write_jsonl(tmp_path / "in" / name, events)
    spec = {"jobId": "windows", "parallelism": 2, "model": model}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    plans = compiler.compile_model(load_file(tmp_path / "job.yaml"))
    result = runner.run_job(plans, runner.RunOptions(quiet=True, workdir=tmp_path / ".nopstream"))
    for name in ("sum", "avg"):
        assert multiset(read_outputs(tmp_path / "out" / name)) == multiset(expected[name]), name
    if combine is False:
        assert result.records_in["sum"] == result.records_in["avg"] == 12_000
    else:  # one partial per key and window from each source subtask, not one record per event
        assert result.records_in["sum"] < 12_000 / 4 and result.records_in["avg"] < 12_000 / 2, (
            result.records_in
        )


def test_a_combiner_is_full_at_its_key_limit_and_hands_everything_over():
    key = KeySelector(field="k", fn=None)
    edge = Edge("a->b", "a", "a", "main", "b", "b", 0, EdgePolicy.HASH, key, "v1", 16, None, ())
    spec = {"id": "b", "type": "aggregate", "aggregate": {"kind": "avg", "field": "v"}, "emit": "final"}
    target = StreamNode("b", "operator", "aggregate", 1, True, key, spec)
    combiner = Combiner(edge, target, limit=3)
    combiner.add(Batch([{"k": "x", "v": 1}, {"k": "y", "v": 4}, {"k": "x", "v": 3}]))
    assert not combiner.full
    combiner.add(Batch([{"k": "z", "v": 5}]))
    assert combiner.full
    keys, records = combiner.drain()
    assert keys == ["x", "y", "z"] and records == [["x", [4, 2]], ["y", [4, 1]], ["z", [5, 1]]]
    assert combiner.drain() == ([], []) and not combiner.full


def test_only_what_gives_the_same_output_is_combined(tmp_path, monkeypatch):
    (tmp_path / "aggfns.py").write_text(
        "class NoMerge:\n    def create(self): return 0\n    def add(self, a, r): return a + 1\n"
        "    def result(self, a): return a\n"
        "class WithMerge(NoMerge):\n    def merge(self, a, b): return a + b\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    key = KeySelector(field="k", fn=None)
    edge = Edge("a->b", "a", "a", "main", "b", "b", 0, EdgePolicy.HASH, key, "v1", 16, None, ())

    def node(kind: str, **spec) -> StreamNode:
        return StreamNode("b", "operator", kind, 1, True, key, {"id": "b", "type": kind, **spec})

    event = {"kind": "tumbling", "time": "event", "sizeMs": 10}
    assert combines(edge, node("aggregate", aggregate={"kind": "count"}, emit="final"))
    assert combines(edge, node("aggregate", aggregate={"fn": "aggfns:WithMerge"}, emit="final"))
    assert combines(edge, node("reduce", fn="aggfns:x", emit="final"))
    assert combines(edge, node("window", aggregate={"kind": "sum", "field": "v"}, window=event))
    refused = [
        node("aggregate", aggregate={"kind": "count"}),  # rolling: every update is output
        node("aggregate", aggregate={"kind": "count"}, emit="final", combine=False),
        node("aggregate", aggregate={"fn": "aggfns:NoMerge"}, emit="final"),  # cannot merge partials
        node("window", aggregate={"kind": "sum", "field": "v"}, window={**event, "allowedLatenessMs": 5}),
        node("window", aggregate={"kind": "sum", "field": "v"}, window={**event, "lateOutput": "late"}),
        node("window", aggregate={"kind": "sum", "field": "v"}, window={**event, "time": "processing"}),
        node("window", aggregate={"kind": "sum", "field": "v"}, window={"kind": "session", "time": "event"}),
        node("window", fn="aggfns:x", window=event),  # a window function sees the records
    ]
    assert [combines(edge, n) for n in refused] == [False] * len(refused)
    other_key = Edge(
        "a->b", "a", "a", "main", "b", "b", 0, EdgePolicy.HASH, KeySelector("j", None), "v1", 16, None, ()
    )
    assert not combines(other_key, node("aggregate", aggregate={"kind": "count"}, emit="final"))
