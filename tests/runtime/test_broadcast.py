"""Broadcast state (Flink's KeyedBroadcastProcessFunction): `examples/rules.yaml`, rules broadcast to
every subtask of a keyed process, each transaction checked against the rules in force at its time.

The expected alerts are computed from the files in plain Python: every rule that is not late
applies from its timestamp on, whatever subtask a transaction's account falls to and whenever
the rules arrive there, at parallelism 1, 2 and 4, in task processes and in one process.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from tests.runtime.conftest import marked_stripes, multiset, read_outputs, run_example, run_job


def in_force(versions: list[tuple[int, dict[str, Any]]], ts: int) -> dict[str, Any] | None:
    valid = [v for v in versions if v[0] <= ts]
    return max(valid, key=lambda v: v[0])[1] if valid else None


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_the_rules_example_checks_each_transaction_against_the_rules_of_its_time(tmp_path, mode, parallelism):
    data = run_example(tmp_path, "rules", parallelism=parallelism, mode=mode)
    rules: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for rule, mark in marked_stripes(data / "rules.jsonl", 2000):
        if rule["ts"] > mark:
            rules.setdefault(rule["rule"], []).append((rule["ts"], rule))
    want: list[dict[str, Any]] = []
    for txn, mark in marked_stripes(data / "transactions.jsonl", 2000):
        if txn["ts"] <= mark:
            want.append({"late": txn["txn"]})
            continue
        limit = in_force(rules["max-amount"], txn["ts"])
        if limit is not None and txn["amount"] > limit["limit"]:
            want.append({"alert": "max-amount", "txn": txn["txn"], "limit": limit["limit"]})
        blocked = in_force(rules["blocked"], txn["ts"])
        if blocked is not None and txn["merchant"] in blocked["merchants"]:
            want.append({"alert": "blocked", "txn": txn["txn"], "merchant": txn["merchant"]})
    limits = {r["limit"] for _, r in rules["max-amount"]}
    assert len(limits) == 5 and sum(1 for r in want if "late" in r) > 100 and len(want) > 900
    assert multiset(read_outputs(tmp_path / "out" / "rules" / "alerts")) == multiset(want)


def test_keyed_records_only_read_the_broadcast_state_and_broadcast_records_have_no_key(tmp_path):
    fns = """
        def ident(record):
            return record

        class Probe:
            def process_broadcast(self, record, ctx):
                ctx.broadcast_state("seen")[str(record)] = True
                try:
                    ctx.value("x")
                except RuntimeError as e:
                    assert "process_broadcast has no current key" in str(e)
                return []

            def process(self, record, ctx):
                try:
                    ctx.broadcast_state("seen")["x"] = 1
                except TypeError:
                    return [{"n": record, "read-only": True}]
                return [{"n": record, "read-only": False}]
    """
    model = {
        "sources": [
            {"id": "nums", "type": "generator", "config": {"count": 50}},
            {"id": "rules", "type": "generator", "parallelism": 1, "config": {"count": 3}},
        ],
        "operators": [
            {
                "id": "p",
                "type": "process",
                "inputs": ["nums", "rules"],
                "broadcast": ["rules"],
                "key": {"fn": "jobfns:ident"},
                "fn": "jobfns:Probe",
            }
        ],
        "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
    }
    out = run_job(tmp_path, model, mode="in-process", fns=textwrap.dedent(fns), parallelism=2)
    assert multiset(out["out"]) == multiset([{"n": n, "read-only": True} for n in range(50)])
