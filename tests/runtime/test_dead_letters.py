"""Bad records: set aside on a dead-letter output (`onError: dead-letter`), or failing the run named.

A file of 10,000 orders, 1 % of them bad in five ways (a line that is not JSON, no
timestamp, no customer to key by, an amount that is not a number, a negative amount the
user's process refuses), goes through a source, a map, a keyed process and a final sum
with `onError: dead-letter`: the main outputs are exactly what plain Python makes of the
good records, each dead-letter output exactly the bad records of its operator with their
errors (and the user's file and line where the user's code raised).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from nopstream.connectors.stripes import STRIPE_BYTES
from tests.conftest import after_dashboard_line, run_nopstream
from tests.runtime.conftest import multiset, run_job

FNS = """\
def parse(order):
    return {**order, "amount": float(order["amount"])}


class Check:
    def process(self, order, ctx):
        if order["amount"] < 0:
            raise ValueError(f"negative amount {order['amount']}")
        return [{"id": order["id"], "customer": order["customer"], "amount": order["amount"]}]
"""
BAD = ("not-json", "no-ts", "no-customer", "not-a-number", "negative")
RULE = " (rule: a source of format jsonl reads JSON lines)"


def orders(count: int = 10_000, seed: int = 32) -> list[tuple[str, str | None]]:
    """(line, what is wrong with it or None) in file order; 1 % bad, evenly over the five ways."""
    rng, lines = random.Random(seed), []
    bad_at = {i: BAD[n % len(BAD)] for n, i in enumerate(sorted(rng.sample(range(count), count // 100)))}
    for i in range(count):
        order: dict[str, Any] = {
            "id": i,
            "customer": f"c{rng.randrange(50)}",
            "amount": rng.randrange(1, 500),
            "ts": i * 10,
        }
        wrong = bad_at.get(i)
        if wrong == "not-json":
            lines.append((f'{{"id": {i}, "customer": broken', wrong))
            continue
        if wrong == "no-ts":
            del order["ts"]
        elif wrong == "no-customer":
            del order["customer"]
        elif wrong == "not-a-number":
            order["amount"] = "a lot"
        elif wrong == "negative":
            order["amount"] = -order["amount"]
        lines.append((json.dumps(order), wrong))
    return lines


def model(on_error: str = "dead-letter") -> dict[str, Any]:
    def sink(name: str, ref: str) -> dict[str, Any]:
        return {"id": name, "type": "file", "inputs": [ref], "config": {"path": f"out/{name}"}}

    return {
        "sources": [
            {
                "id": "orders",
                "type": "file",
                "config": {"path": "in/orders.jsonl", "format": "jsonl"},
                "watermark": {"timestampField": "ts", "maxOutOfOrdernessMs": 0},
                "onError": on_error,
            }
        ],
        "operators": [
            {"id": "parse", "type": "map", "inputs": ["orders"], "fn": "jobfns:parse", "onError": on_error},
            {
                "id": "check",
                "type": "process",
                "inputs": ["parse"],
                "key": {"field": "customer"},
                "fn": "jobfns:Check",
                "onError": on_error,
                **({"deadLetterOutput": "refused"} if on_error == "dead-letter" else {}),
            },
            {
                "id": "sum",
                "type": "aggregate",
                "inputs": ["check"],
                "key": {"field": "customer"},
                "aggregate": {"kind": "sum", "field": "amount"},
                "emit": "final",
            },
        ],
        "sinks": [sink("checked", "check"), sink("sums", "sum")]
        + (
            [
                sink("bad-orders", "orders:dead-letter"),
                sink("bad-parse", "parse:dead-letter"),
                sink("bad-check", "check:refused"),
            ]
            if on_error == "dead-letter"
            else []
        ),
    }


def expected(lines: list[tuple[str, str | None]], fns: Path) -> dict[str, list[Any]]:
    """What each sink must hold, by plain Python over the lines."""
    out: dict[str, list[Any]] = defaultdict(list)
    sums: dict[str, float] = defaultdict(float)
    offset = 0
    for line, wrong in lines:
        order = None if wrong == "not-json" else json.loads(line)
        if wrong == "not-json":
            split = f"in/orders.jsonl#{offset // STRIPE_BYTES}"
            where = f"split '{split}' of 'in/orders.jsonl': the line at byte {offset} is not JSON"
            out["bad-orders"].append(("orders", where, None, line))
        elif wrong == "no-ts":
            out["bad-orders"].append(("orders", "KeyError: 'ts'", None, order))
        elif wrong == "not-a-number":
            at = f"{fns}:2 in parse"
            out["bad-parse"].append(
                ("parse", "ValueError: could not convert string to float: 'a lot'", at, order)
            )
        elif wrong == "no-customer":
            out["bad-check"].append(
                ("check", "KeyError: 'customer'", None, {**order, "amount": float(order["amount"])})
            )
        elif wrong == "negative":
            amount = float(order["amount"])
            at = f"{fns}:8 in process"
            out["bad-check"].append(
                ("check", f"ValueError: negative amount {amount}", at, {**order, "amount": amount})
            )
        else:
            out["checked"].append(
                {"id": order["id"], "customer": order["customer"], "amount": float(order["amount"])}
            )
            sums[order["customer"]] += float(order["amount"])
        offset += len(line) + 1
    out["sums"] = [{"key": c, "value": v} for c, v in sums.items()]
    return out


def letters(records: list[dict[str, Any]]) -> list[tuple[str, str, str | None, Any]]:
    """Dead letters as comparable tuples; an unreadable line's error up to its parser's own words."""
    found = []
    for r in records:
        error = r["error"]
        if " is not JSON (" in error:
            assert error.endswith(")" + RULE), error
            error = error.split(" (", 1)[0]
        found.append((r["operator"], error, r["at"], r["record"]))
    return found


def test_bad_records_go_to_their_operators_dead_letter_outputs_and_the_good_ones_on(tmp_path, mode):
    lines = orders()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "orders.jsonl").write_text("".join(line + "\n" for line, _ in lines))
    assert (tmp_path / "in" / "orders.jsonl").stat().st_size > 2 * STRIPE_BYTES, "several stripes"
    want = expected(lines, tmp_path / "jobfns.py")
    assert [len(want[f"bad-{s}"]) for s in ("orders", "parse", "check")] == [40, 20, 40]
    out = run_job(tmp_path, model(), mode=mode, fns=FNS, parallelism=2)
    assert multiset(out["checked"]) == multiset(want["checked"])
    assert multiset(out["sums"]) == multiset(want["sums"])
    for name in ("bad-orders", "bad-parse", "bad-check"):
        assert multiset(letters(out[name])) == multiset(want[name]), name


def test_with_on_error_fail_a_bad_record_fails_the_run_naming_the_operator_the_error_and_the_line(tmp_path):
    (tmp_path / "in").mkdir()
    good = {"id": 1, "customer": "c1", "amount": 5, "ts": 10}
    (tmp_path / "in" / "orders.jsonl").write_text(
        json.dumps(good) + "\n" + json.dumps({**good, "amount": "a lot"}) + "\n"
    )
    (tmp_path / "jobfns.py").write_text(FNS)
    job = {"jobId": "test", "semanticMode": "STRICT_EXACTLY_ONCE", "parallelism": 1, "model": model("fail")}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    result = run_nopstream("run", "job.yaml", "--max-restarts", "0", cwd=tmp_path)
    assert result.code == 3  # the job failed
    last = after_dashboard_line(result.err).strip().splitlines()[-1]
    assert last == (
        "operator 'parse' (map) failed: ValueError: could not convert"
        f" string to float: 'a lot' at {tmp_path / 'jobfns.py'}:2 in parse"
    )
    assert "Traceback" not in result.err  # the user's frame is in the line
