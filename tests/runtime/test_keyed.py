"""reduce and aggregate (built-ins and a user aggregate), rolling and final, against plain Python."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from tests.runtime.conftest import multiset, run_job

FNS = """
def keep_max(acc, r):
    return r if r["v"] > acc["v"] else acc

class Spread:
    '''A user aggregate: max - min of v.'''
    def create(self):
        return None
    def add(self, acc, r):
        v = r["v"]
        return [v, v] if acc is None else [min(acc[0], v), max(acc[1], v)]
    def merge(self, a, b):
        return b if a is None else a if b is None else [min(a[0], b[0]), max(a[1], b[1])]
    def result(self, acc):
        return acc[1] - acc[0]
"""


def keyed_events(n: int, files: int, seed: int) -> dict[str, list[dict[str, int | str]]]:
    """Key k{j} lives in file j mod files only, so each key's order is its file's order."""
    rng = random.Random(seed)
    out: dict[str, list[dict[str, int | str]]] = {f"part-{i}.jsonl": [] for i in range(files)}
    for _ in range(n):
        j = rng.randrange(40)
        out[f"part-{j % files}.jsonl"].append({"k": f"k{j}", "v": rng.randrange(-500, 500)})
    return out


def job(operators: list[dict], parallelism: int) -> dict:
    return {
        "sources": [{"id": "src", "type": "file", "config": {"path": "in/*.jsonl", "format": "jsonl"}}],
        "operators": operators,
        "sinks": [
            {"id": "out", "type": "file", "inputs": [operators[-1]["id"]], "config": {"path": "out/out"}}
        ],
    }


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_rolling_aggregates(tmp_path, mode, parallelism):
    inputs = keyed_events(4000, 4, seed=parallelism)
    ops = [
        {"id": "by-k", "type": "key_by", "inputs": ["src"], "key": {"field": "k"}},
        {"id": "sum", "type": "aggregate", "inputs": ["by-k"], "aggregate": {"kind": "sum", "field": "v"}},
    ]
    out = run_job(tmp_path, job(ops, parallelism), mode=mode, inputs=inputs, parallelism=parallelism)
    expected = []
    for records in inputs.values():
        running: dict[str, int] = defaultdict(int)
        for r in records:
            running[r["k"]] += r["v"]
            expected.append({"key": r["k"], "value": running[r["k"]]})
    assert multiset(out["out"]) == multiset(expected)


KINDS = ["count", "sum", "min", "max", "avg", "user"]


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_final_aggregates(tmp_path, mode, parallelism):
    inputs = keyed_events(3000, 3, seed=11)
    model = {
        "sources": [{"id": "src", "type": "file", "config": {"path": "in/*.jsonl", "format": "jsonl"}}],
        "operators": [
            {
                "id": kind,
                "type": "aggregate",
                "inputs": ["src"],
                "key": {"field": "k"},
                "emit": "final",
                "aggregate": {"fn": "jobfns:Spread"} if kind == "user" else {"kind": kind, "field": "v"},
            }
            for kind in KINDS
        ],
        "sinks": [
            {"id": f"{kind}-out", "type": "file", "inputs": [kind], "config": {"path": f"out/{kind}"}}
            for kind in KINDS
        ],
    }
    out = run_job(tmp_path, model, mode=mode, fns=FNS, inputs=inputs, parallelism=parallelism)
    values: dict[str, list[int]] = defaultdict(list)
    for records in inputs.values():
        for r in records:
            values[r["k"]].append(r["v"])
    results = {
        "count": len,
        "sum": sum,
        "min": min,
        "max": max,
        "avg": lambda vs: sum(vs) / len(vs),
        "user": lambda vs: max(vs) - min(vs),
    }
    for kind, result in results.items():
        expected = [{"key": k, "value": result(vs)} for k, vs in values.items()]
        assert multiset(out[f"{kind}-out"]) == multiset(expected), kind


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_final_aggregates_over_list_keys_merge_their_partials_by_key(tmp_path, mode, parallelism):
    # list keys travel as JSON arrays in partials and snapshots, and are tuples in the state
    rng = random.Random(3)
    inputs: dict[str, list[dict]] = {f"part-{i}.jsonl": [] for i in range(3)}
    values: dict[tuple[str, int], list[int]] = defaultdict(list)
    for _ in range(3000):
        key, v = [f"k{rng.randrange(8)}", rng.randrange(5)], rng.randrange(-50, 50)
        inputs[f"part-{rng.randrange(3)}.jsonl"].append({"k": key, "v": v})
        values[(key[0], key[1])].append(v)
    model = {
        "sources": [{"id": "src", "type": "file", "config": {"path": "in/*.jsonl", "format": "jsonl"}}],
        "operators": [
            {"id": kind, "type": "aggregate", "inputs": ["src"], "key": {"field": "k"}, "emit": "final"}
            | {"aggregate": {"kind": kind, "field": "v"}}
            for kind in ("count", "sum", "avg")
        ],
        "sinks": [
            {"id": f"{kind}-out", "type": "file", "inputs": [kind], "config": {"path": f"out/{kind}"}}
            for kind in ("count", "sum", "avg")
        ],
    }
    out = run_job(tmp_path, model, mode=mode, inputs=inputs, parallelism=parallelism)
    for kind, result in {"count": len, "sum": sum, "avg": lambda vs: sum(vs) / len(vs)}.items():
        expected = [{"key": list(k), "value": result(vs)} for k, vs in values.items()]
        assert multiset(out[f"{kind}-out"]) == multiset(expected), kind


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_reduce_rolling_and_final(tmp_path, mode, parallelism):
    inputs = keyed_events(3000, 4, seed=5)
    model = {
        "sources": [{"id": "src", "type": "file", "config": {"path": "in/*.jsonl", "format": "jsonl"}}],
        "operators": [
            {"id": "by-k", "type": "key_by", "inputs": ["src"], "key": {"field": "k"}},
            {"id": "rolling", "type": "reduce", "inputs": ["by-k"], "fn": "jobfns:keep_max"},
            {"id": "final", "type": "reduce", "inputs": ["by-k"], "fn": "jobfns:keep_max", "emit": "final"},
        ],
        "sinks": [
            {"id": "rolling-out", "type": "file", "inputs": ["rolling"], "config": {"path": "out/rolling"}},
            {"id": "final-out", "type": "file", "inputs": ["final"], "config": {"path": "out/final"}},
        ],
    }
    out = run_job(tmp_path, model, mode=mode, fns=FNS, inputs=inputs, parallelism=parallelism)
    rolling, best = [], {}
    for records in inputs.values():
        for r in records:
            best[r["k"]] = r if r["k"] not in best or r["v"] > best[r["k"]]["v"] else best[r["k"]]
            rolling.append(best[r["k"]])
    assert multiset(out["rolling-out"]) == multiset(rolling)
    assert multiset(out["final-out"]) == multiset(list(best.values()))
