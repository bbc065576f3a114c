"""map, filter, flat_map, key_by and union through `nopstream run`, against plain Python."""

from __future__ import annotations

import random

import pytest

from tests.runtime.conftest import multiset, run_job

FNS = """
def double(r):
    return {"k": r["k"], "v": r["v"] * 2}

def is_even(r):
    return r["v"] % 2 == 0

def explode(r):
    return [{"k": r["k"], "v": r["v"]}, {"k": r["k"], "v": -r["v"]}] if r["v"] % 3 else []
"""


def events(n: int, files: int, seed: int) -> dict[str, list[dict[str, int | str]]]:
    rng = random.Random(seed)
    out: dict[str, list[dict[str, int | str]]] = {f"part-{i}.jsonl": [] for i in range(files)}
    for i in range(n):
        out[f"part-{i % files}.jsonl"].append({"k": f"k{rng.randrange(50)}", "v": rng.randrange(1000)})
    return out


def source(parallelism: int) -> dict:
    return {
        "id": "src",
        "type": "file",
        "parallelism": parallelism,
        "config": {"path": "in/*.jsonl", "format": "jsonl"},
    }


def sink(inputs: list[str], name: str = "out", parallelism: int | None = None) -> dict:
    s = {"id": name, "type": "file", "inputs": inputs, "config": {"path": f"out/{name}"}}
    if parallelism is not None:
        s["parallelism"] = parallelism
    return s


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_map_filter_flat_map_chain(tmp_path, mode, parallelism):
    inputs = events(5000, 5, seed=parallelism)
    model = {
        "sources": [source(parallelism)],
        "operators": [
            {"id": "double", "type": "map", "inputs": ["src"], "fn": "jobfns:double"},
            {"id": "even", "type": "filter", "inputs": ["double"], "fn": "jobfns:is_even"},
            {
                "id": "explode",
                "type": "flat_map",
                "inputs": ["src"],
                "fn": "jobfns:explode",
                "parallelism": 3,
            },
        ],
        "sinks": [sink(["even"], "evens"), sink(["explode"], "exploded", parallelism=2)],
    }
    out = run_job(tmp_path, model, mode=mode, fns=FNS, inputs=inputs, parallelism=parallelism)
    all_in = [r for records in inputs.values() for r in records]
    doubled = [{"k": r["k"], "v": r["v"] * 2} for r in all_in]
    assert multiset(out["evens"]) == multiset([r for r in doubled if r["v"] % 2 == 0])
    exploded = [
        x for r in all_in if r["v"] % 3 for x in ({"k": r["k"], "v": r["v"]}, {"k": r["k"], "v": -r["v"]})
    ]
    assert multiset(out["exploded"]) == multiset(exploded)


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_key_by_routes_each_key_to_one_sink_subtask(tmp_path, mode, parallelism):
    inputs = events(3000, 4, seed=7)
    model = {
        "sources": [source(2)],
        "operators": [{"id": "by-k", "type": "key_by", "inputs": ["src"], "key": {"field": "k"}}],
        "sinks": [sink(["by-k"], parallelism=parallelism)],
    }
    out = run_job(tmp_path, model, mode=mode, inputs=inputs, parallelism=parallelism)
    all_in = [r for records in inputs.values() for r in records]
    assert multiset(out["out"]) == multiset(all_in)
    per_file: dict[str, set[str]] = {}
    for f in (tmp_path / "out" / "out").glob("*.jsonl"):
        import json

        per_file[f.name] = {json.loads(line)["k"] for line in f.read_text().splitlines()}
    files_of_key: dict[str, int] = {}
    for keys in per_file.values():
        for k in keys:
            files_of_key[k] = files_of_key.get(k, 0) + 1
    assert set(files_of_key.values()) == {1}, "a key reached more than one sink subtask"
    assert len(per_file) == min(parallelism, len(files_of_key))


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_union_of_two_sources(tmp_path, mode, parallelism):
    a = events(2000, 2, seed=1)
    b = {f"b-{name}": records for name, records in events(1500, 3, seed=2).items()}
    model = {
        "sources": [
            {"id": "a", "type": "file", "config": {"path": "in/part-*.jsonl", "format": "jsonl"}},
            {
                "id": "b",
                "type": "file",
                "parallelism": 1,
                "config": {"path": "in/b-*.jsonl", "format": "jsonl"},
            },
        ],
        "operators": [{"id": "both", "type": "union", "inputs": ["a", "b"]}],
        "sinks": [sink(["both"])],
    }
    out = run_job(tmp_path, model, mode=mode, inputs={**a, **b}, parallelism=parallelism)
    expected = [r for records in list(a.values()) + list(b.values()) for r in records]
    assert multiset(out["out"]) == multiset(expected)


def test_slow_chains_get_smaller_source_batches_and_fast_ones_grow_back():
    from nopstream.runtime.pacing import TaskSettings, next_batch_size

    settings = TaskSettings(batch_size=1000, batch_target_ms=50)
    assert next_batch_size(1000, 1000, 3.0, settings) == 16  # 3 ms a record: 16 records in 50 ms
    assert next_batch_size(16, 16, 0.0001, settings) == 32
    assert next_batch_size(800, 800, 0.01, settings) == 1000  # never above the configured size
    assert next_batch_size(10, 10, 60.0, settings) == 1
