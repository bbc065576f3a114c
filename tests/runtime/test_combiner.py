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
from nopstream.runtime.combiner import Combiner
from tests.conftest import run_nopstream
from tests.runtime.conftest import multiset, read_outputs

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
    assert combiner.drain() == {"x": [4, 2], "y": [4, 1], "z": [5, 1]}
    assert combiner.drain() == {} and not combiner.full
