"""The job shapes `nopstream chaos` is run on in CI, with their inputs and user functions.

Each is small enough to run in seconds and deterministic, so that its failure-free
output is one multiset. Under kills each is paced at its sources (a function that
sleeps PACE a record, chained to the source, so the source reads no faster): a source
that read its whole input into the channels at once would leave one durable epoch, the
final one, and the kills of `nopstream chaos` would have no state to restore. Its
checkpoints come every 150 ms, so it makes dozens of durable epochs for the schedule to
follow. The failure-free run is not paced (chaos names it in `NOPSTREAM_CHAOS_RUN`): it
only has to end, and the same output at full speed is part of the proof.
"""

from __future__ import annotations

import io
import json
import random
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import EXAMPLES

ENRICH = """
class Enrich:
    # orders get the customer's tier valid at their time (the input whose name ends in "tiers"
    # brings tier updates); a record behind its mark is late, named and dropped

    def process(self, record, ctx):
        if ctx.timestamp <= ctx.watermark:
            return [{"late": ctx.input, "id": record["id"]}]
        if ctx.input.endswith("tiers"):
            ctx.list("versions").append([ctx.timestamp, record["tier"]])
        else:
            ctx.list("orders").append([ctx.timestamp, record])
            ctx.register_event_timer(ctx.timestamp)
        return []

    def on_timer(self, ts, ctx):
        assert ctx.watermark == ts and ctx.input is None
        versions = sorted(ctx.list("versions"))
        due = [o for t, o in ctx.list("orders") if t <= ts]
        ctx.list("orders")[:] = [[t, o] for t, o in ctx.list("orders") if t > ts]
        out = []
        for order in due:
            tiers = [tier for vts, tier in versions if vts <= order["ts"]]
            out.append({**order, "tier": tiers[-1] if tiers else None})
        return out
"""
"""A keyed process of two inputs, orders and tier updates (`tests/runtime/test_co_process.py` too)."""

FNS = (
    """
import os
import time

# seconds a record, in the function chained to each source, under kills (the failure-free run of
# `nopstream chaos` only has to end)
UNDER_KILLS = os.environ.get("NOPSTREAM_CHAOS_RUN") != "failure-free"
PACE = float(os.environ.get("CHAOS_PACE", "0.002")) if UNDER_KILLS else 0.0

def split(line):
    time.sleep(PACE)
    return line.split()

def word(w):
    return w

def slow(r):
    time.sleep(PACE)
    return r

def tag_a(line):
    time.sleep(PACE)
    return {"src": "a", "line": line}

def tag_b(line):
    time.sleep(PACE)
    return {"src": "b", "line": line}

def is_small(c):
    return c["amount"] < 10

def is_large(c):
    return c["amount"] > 500

def alert(match):
    small, large = match["small"][0], match["large"][0]
    return {"card": small["card"], "small": small["ts"], "large": large["ts"]}

def upper(line):
    time.sleep(PACE)
    return line.upper()

def row_key(change):
    row = change["after"] or change["before"]
    return f"{change['table']}:{row['id']}"

def long_enough(line):
    return len(line) > 10

class Recent:
    # per customer, how many orders since it was last quiet for longer than the state TTL

    def process(self, record, ctx):
        ctx.set_value("n", ctx.value("n", 0) + 1)
        return [{"customer": ctx.key, "id": record["id"], "n": ctx.value("n")}]

def parse(order):
    return {**order, "amount": float(order["amount"])}

class Check:
    # refuses a negative amount; counts each customer's orders (state a restore must bring back)

    def process(self, order, ctx):
        if order["amount"] < 0:
            raise ValueError(f"negative amount {order['amount']}")
        ctx.set_value("n", ctx.value("n", 0) + 1)
        return [{"id": order["id"], "customer": ctx.key, "n": ctx.value("n")}]

class Reminders:
    # per key, a reminder at the end of each second of event time one of its events fell in

    def process(self, record, ctx):
        ctx.register_event_timer(record["ts"] // 1000 * 1000 + 999)
        return []

    def on_timer(self, ts, ctx):
        return [{"key": ctx.key, "second": ts // 1000}]
"""
    + ENRICH
)


def rolling_word_count(fns: str = "chaosfns", *, emit: str = "rolling") -> list[dict[str, Any]]:
    """Operators of a word count: split lines, key by word, count (every update emitted, or each word's
    count at the end: `emit: final`, pre-aggregated before the shuffle)."""
    return [
        {"id": "split", "type": "flat_map", "fn": f"{fns}:split"},
        {"id": "by-word", "type": "key_by", "key": {"fn": f"{fns}:word"}},
        {"id": "count", "type": "aggregate", "aggregate": "count", "emit": emit},
    ]


def _words(rng: random.Random, files: int, lines: int, vocabulary: int = 200) -> dict[str, str]:
    words = [f"w{i}" for i in range(vocabulary)]
    return {
        f"part-{f}.txt": "".join(" ".join(rng.choices(words, k=6)) + "\n" for _ in range(lines))
        for f in range(files)
    }


def _lines(home: Path) -> dict[str, Any]:
    """A file source of the text lines written into `home`'s input directory."""
    return {"id": "lines", "type": "file", "config": {"path": f"{home}/in/*.txt"}}


def _events(source_id: str, path: str, *, out_of_order_ms: int) -> dict[str, Any]:
    """A file source of JSON events whose watermark follows their `ts`."""
    return {
        "id": source_id,
        "type": "file",
        "config": {"path": path, "format": "jsonl"},
        "watermark": {"timestampField": "ts", "maxOutOfOrdernessMs": out_of_order_ms},
    }


def _job(job_id: str, model: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"jobId": job_id, "checkpoint": {"intervalMs": 150}, **spec, "model": model}


def rolling_count(home: Path) -> dict[str, Any]:
    """A running count (rolling) at parallelism 3 into a file sink at parallelism 2."""
    _write(home, _words(random.Random(1), 4, 1500))
    return _job(
        "rolling-count",
        {
            "sources": [_lines(home)],
            "operators": rolling_word_count(),
            "sinks": [{"id": "out", "type": "file", "parallelism": 2, "config": {"path": "out"}}],
        },
        parallelism=3,
    )


def final_count(home: Path) -> dict[str, Any]:
    """Final counts at parallelism 3, whose splitters pre-aggregate (a combiner) before the shuffle."""
    _write(home, _words(random.Random(2), 4, 1500))
    return _job(
        "final-count",
        {
            "sources": [_lines(home)],
            "operators": rolling_word_count(emit="final"),
            "sinks": [{"id": "out", "type": "file", "parallelism": 2, "config": {"path": "out"}}],
        },
        parallelism=3,
    )


def windows(home: Path) -> dict[str, Any]:
    """Event-time tumbling windows with late data into a side output.

    Every 50th event is 3 s late, the others out of order by up to 300 ms against the
    watermark's 100 ms, so many come near it: what is late must not depend on where the
    source's batches end or where a restore resumes. (Before records were judged by their
    split's mark, the schedule found that it did: the watermark followed each batch.)
    """
    rng = random.Random(3)
    events = [
        {
            "k": f"k{rng.randrange(12)}",
            "v": rng.randrange(100),
            "ts": i * 5 + rng.randrange(-300, 1) - (3000 if i % 50 == 49 else 0),
        }
        for i in range(3500)
    ]
    _write_jsonl(home, {"events.jsonl": events})
    return _job(
        "late-windows",
        {
            "sources": [_events("src", f"{home}/in/events.jsonl", out_of_order_ms=100) | {"parallelism": 1}],
            "operators": [
                {"id": "slow", "type": "map", "fn": "chaosfns:slow", "parallelism": 1},
                {
                    "id": "win",
                    "type": "window",
                    "key": {"field": "k"},
                    "aggregate": {"kind": "sum", "field": "v"},
                    "window": {"kind": "tumbling", "time": "event", "sizeMs": 500, "lateOutput": "late"},
                },
            ],
            "sinks": [
                {"id": "out", "type": "file", "inputs": ["win"], "config": {"path": "out"}},
                {"id": "late", "type": "file", "inputs": ["win:late"], "config": {"path": "late"}},
            ],
        },
        parallelism=2,
    )


def windowed_events(seed: int, files: int, per_file: int) -> dict[str, list[dict[str, Any]]]:
    """Keyed events per file whose timestamps are out of order by less than 100 ms: never late."""
    rng = random.Random(seed)
    return {
        f"part-{f}.jsonl": [
            {"k": f"k{rng.randrange(12)}", "v": rng.randrange(100), "ts": 100 + i * 5 + rng.randrange(-90, 1)}
            for i in range(per_file)
        ]
        for f in range(files)
    }


def combined_events() -> dict[str, list[dict[str, Any]]]:
    """The input of `combined_windows`: one file of one stripe."""
    return windowed_events(4, 1, 6000)


def combined_windows(home: Path) -> dict[str, Any]:
    """Event-time sliding averages at parallelism 2, whose maps pre-aggregate per key and window. One
    paced subtask reads the one file, so the watermark moves from the first batch (two files may both
    fall to one subtask, which holds its watermark until it begins the second)."""
    _write_jsonl(home, combined_events())
    return _job(
        "combined-windows",
        {
            "sources": [_events("src", f"{home}/in/*.jsonl", out_of_order_ms=100) | {"parallelism": 1}],
            "operators": [
                {"id": "pace", "type": "map", "fn": "chaosfns:slow", "parallelism": 1},
                {"id": "slow", "type": "map", "fn": "chaosfns:slow"},
                {
                    "id": "win",
                    "type": "window",
                    "key": {"field": "k"},
                    "aggregate": {"kind": "avg", "field": "v"},
                    "window": {"kind": "sliding", "time": "event", "sizeMs": 1000, "slideMs": 250},
                },
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
        parallelism=2,
    )


def reminders(home: Path) -> dict[str, Any]:
    """A keyed process function whose every output is an event-time timer firing: a timer lost in a
    restore is a record missing. One file of one stripe, read by one subtask: its watermark, and so
    the timers, move from the first batch (a subtask holds it while a stripe of its is not begun)."""
    events = windowed_events(6, 1, 4500)
    _write_jsonl(home, events)
    return _job(
        "reminders",
        {
            "sources": [_events("src", f"{home}/in/*.jsonl", out_of_order_ms=100) | {"parallelism": 1}],
            "operators": [
                {"id": "pace", "type": "map", "fn": "chaosfns:slow", "parallelism": 1},
                {"id": "remind", "type": "process", "key": {"field": "k"}, "fn": "chaosfns:Reminders"},
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
        parallelism=2,
    )


def _orders_and_tiers(home: Path) -> list[dict[str, Any]]:
    """Orders and customer tier updates, one file each (one in 40 two seconds behind: late), read
    at parallelism 1 and paced: the operators of `enrichment` and `joins` read `pace-orders` and
    `pace-tiers`."""
    rng = random.Random(8)

    def stream(n: int, step: int, make: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for i in range(n):
            ts = 1_000 + i * step + rng.randrange(-150, 1) - (2_000 if i % 40 == 39 else 0)
            out.append({"id": f"{step}-{i}", "customer": f"c{rng.randrange(25)}", "ts": ts, **make()})
        return out

    orders = stream(3500, 5, lambda: {"amount": rng.randrange(1, 500)})
    tiers = stream(1400, 12, lambda: {"tier": rng.choice(["bronze", "silver", "gold"])})
    _write_jsonl(home, {"orders.jsonl": orders, "tiers.jsonl": tiers})
    return [
        _events("orders", f"{home}/in/orders.jsonl", out_of_order_ms=100) | {"parallelism": 1},
        _events("tiers", f"{home}/in/tiers.jsonl", out_of_order_ms=100) | {"parallelism": 1},
    ]


_PACES = [
    {"id": f"pace-{name}", "type": "map", "inputs": [name], "fn": "chaosfns:slow", "parallelism": 1}
    for name in ("orders", "tiers")
]


def dead_letters(home: Path) -> dict[str, Any]:
    """Orders of which one in a hundred is bad (not JSON, no timestamp, no customer, an amount that is
    not a number, a negative amount) through a source, a map and a keyed process that all dead-letter:
    each bad record set aside once by its node, the good ones counted per customer. Paced by its
    source (`CHAOS_ARGS`): a source with a consumer of its dead letters is chained to nothing, so a
    paced function after it would only fill its channel and hold every barrier back."""
    rng, lines = random.Random(32), []
    for i in range(3000):
        customer, amount = f"c{rng.randrange(25)}", rng.randrange(1, 500)
        order: dict[str, Any] = {"id": i, "customer": customer, "amount": amount, "ts": 1_000 + i * 5}
        wrong = i % 100
        if wrong == 7:
            lines.append(f'{{"id": {i}, "customer": broken')
            continue
        if wrong == 19:
            del order["ts"]
        elif wrong == 41:
            del order["customer"]
        elif wrong == 63:
            order["amount"] = "a lot"
        elif wrong == 85:
            order["amount"] = -order["amount"]
        lines.append(json.dumps(order))
    _write(home, {"orders.jsonl": "".join(line + "\n" for line in lines)})
    source = _events("orders", f"{home}/in/orders.jsonl", out_of_order_ms=0)
    dead = {"onError": "dead-letter"}

    def sink(name: str, ref: str) -> dict[str, Any]:
        return {"id": name, "type": "file", "inputs": [ref], "config": {"path": name}}

    return _job(
        "dead-letters",
        {
            "sources": [source | {"parallelism": 1} | dead],
            "operators": [
                # at the source's parallelism: each customer's orders reach `check` in file order
                {"id": "parse", "type": "map", "inputs": ["orders"], "fn": "chaosfns:parse", "parallelism": 1}
                | dead,
                {"id": "check", "type": "process", "inputs": ["parse"], "key": {"field": "customer"}}
                | {"fn": "chaosfns:Check"}
                | dead,
            ],
            "sinks": [
                sink("checked", "check"),
                sink("bad-orders", "orders:dead-letter"),
                sink("bad-parse", "parse:dead-letter"),
                sink("bad-check", "check:dead-letter"),
            ],
        },
        parallelism=2,
    )


def async_lookup(home: Path, *, url: str) -> dict[str, Any]:
    """Records given a score by an HTTP service (`tests/lookup_server.py`, 20 ms a request) through an
    `async_map` of capacity 20 at parallelism 2, then counted per score (rolling): kills land while
    requests are in flight, and a restore must neither lose nor repeat a result."""
    from tests.lookup_server import FNS as LOOKUP_FNS

    (home / "lookupfns.py").parent.mkdir(parents=True, exist_ok=True)
    (home / "lookupfns.py").write_text(LOOKUP_FNS.format(url=url))
    _write_jsonl(home, {"records.jsonl": [{"id": n} for n in range(3000)]})
    return _job(
        "async-lookup",
        {
            "sources": [
                {
                    "id": "records",
                    "type": "file",
                    "config": {"path": f"{home}/in/records.jsonl", "format": "jsonl"},
                }
            ],
            "operators": [
                {"id": "scored", "type": "async_map", "fn": "lookupfns:score", "async": {"capacity": 20}},
                {"id": "per-score", "type": "aggregate", "key": {"field": "score"}, "aggregate": "count"},
            ],
            "sinks": [
                {"id": "out", "type": "file", "inputs": ["scored"], "config": {"path": "out"}},
                {"id": "counts", "type": "file", "inputs": ["per-score"], "config": {"path": "counts"}},
            ],
        },
        parallelism=2,
    )


def enrichment(home: Path) -> dict[str, Any]:
    """Orders and customer tier updates into a keyed process of two inputs, each keyed by its own
    field: every order with the tier valid at its time (timers and two inputs' state restored)."""
    return _job(
        "enrichment",
        {
            "sources": _orders_and_tiers(home),
            "operators": [
                *_PACES,
                {
                    "id": "enrich",
                    "type": "process",
                    "inputs": ["pace-orders", "pace-tiers"],
                    "keys": [{"field": "customer"}, {"field": "customer"}],
                    "fn": "chaosfns:Enrich",
                },
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
        parallelism=2,
    )


JOINS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "interval": ({"kind": "interval", "how": "full", "lowerMs": -40, "upperMs": 60}, {}),
    "temporal": ({"kind": "temporal", "how": "left"}, {}),
    "temporal-ttl": ({"kind": "temporal", "how": "left"}, {"stateTtlMs": 300}),
    "window": ({"kind": "window", "how": "left", "window": {"kind": "session", "gapMs": 30}}, {}),
}
"""Each join of the `joins` shape: its spec and the operator's other fields."""


def joins(home: Path) -> dict[str, Any]:
    """The orders and tier updates of `enrichment` into a full interval join, two left temporal joins
    (one whose versions expire after 300 ms) and a left session-window join, each into its own sink
    and its late records into another, and the orders into a count per customer whose state expires
    after 200 ms quiet (both sides' state, versions, windows, TTLs and the held-back watermark
    restored)."""
    return _job(
        "joins",
        {
            "sources": _orders_and_tiers(home),
            "operators": [
                *_PACES,
                *(
                    {
                        "id": kind,
                        "type": "join",
                        "inputs": ["pace-orders", "pace-tiers"],
                        "key": {"field": "customer"},
                        "join": spec | {"lateOutput": "late"},
                        **fields,
                    }
                    for kind, (spec, fields) in JOINS.items()
                ),
                {
                    "id": "recent",
                    "type": "process",
                    "inputs": ["pace-orders"],
                    "key": {"field": "customer"},
                    "fn": "chaosfns:Recent",
                    "stateTtlMs": 200,
                },
            ],
            "sinks": [
                {
                    "id": f"{kind}-{output}",
                    "type": "file",
                    "inputs": [f"{kind}{suffix}"],
                    "config": {"path": f"{kind}-{output}"},
                }
                for kind in JOINS
                for output, suffix in (("out", ""), ("late", ":late"))
            ]
            + [{"id": "recent-out", "type": "file", "inputs": ["recent"], "config": {"path": "recent"}}],
        },
        parallelism=2,
    )


def broadcast_rules(home: Path) -> dict[str, Any]:
    """`examples/rules.yaml` with its transactions paced: rules broadcast to every subtask of a keyed
    process, each transaction checked against the rules of its time (broadcast state, keyed waiting
    transactions and their timers restored)."""
    for name in ("transactions.jsonl", "rules.jsonl"):
        _write(home, {name: (EXAMPLES / "data" / "rules" / name).read_text()})
    (home / "rules.py").write_text((EXAMPLES / "rules.py").read_text())
    return _job(
        "broadcast-rules",
        {
            "sources": [
                _events("transactions", f"{home}/in/transactions.jsonl", out_of_order_ms=2000),
                _events("rules", f"{home}/in/rules.jsonl", out_of_order_ms=2000) | {"parallelism": 1},
            ],
            "operators": [
                {"id": "pace", "type": "map", "inputs": ["transactions"], "fn": "chaosfns:slow"},
                {
                    "id": "check",
                    "type": "process",
                    "inputs": ["pace", "rules"],
                    "broadcast": ["rules"],
                    "key": {"field": "account"},
                    "fn": "rules:Rules",
                },
            ],
            "sinks": [{"id": "alerts", "type": "file", "config": {"path": "out"}}],
        },
        parallelism=2,
    )


def cep(home: Path) -> dict[str, Any]:
    """A keyed CEP pattern (a small charge, then a large one on the same card within 2 s)."""
    rng = random.Random(5)
    charges = [
        {"card": f"c{rng.randrange(30)}", "amount": rng.choice([3, 7, 40, 90, 800, 1200]), "ts": i * 20}
        for i in range(3500)
    ]
    _write_jsonl(home, {"charges.jsonl": charges})
    return _job(
        "cep-fraud",
        {
            "sources": [_events("charges", f"{home}/in/*.jsonl", out_of_order_ms=50)],
            "operators": [
                {"id": "pace", "type": "map", "fn": "chaosfns:slow"},
                {
                    "id": "fraud",
                    "type": "cep",
                    "key": {"field": "card"},
                    "pattern": {
                        "steps": [
                            {"name": "small", "where": "chaosfns:is_small"},
                            {"name": "large", "where": "chaosfns:is_large", "contiguity": "relaxed"},
                        ],
                        "withinMs": 2000,
                        "time": "event",
                    },
                },
                {"id": "alert", "type": "map", "fn": "chaosfns:alert"},
            ],
            "sinks": [{"id": "alerts", "type": "file", "config": {"path": "out"}}],
        },
        parallelism=2,
    )


def union(home: Path) -> dict[str, Any]:
    """Two sources of different parallelism joined by a union, counted per word (final)."""
    rng = random.Random(7)
    a, b = _words(rng, 3, 1600), _words(rng, 2, 1600)
    _write(home, {f"a-{k}": v for k, v in a.items()} | {f"b-{k}": v for k, v in b.items()})
    return _job(
        "union-count",
        {
            "sources": [
                {"id": "a", "type": "file", "parallelism": 2, "config": {"path": f"{home}/in/a-*.txt"}},
                {"id": "b", "type": "file", "parallelism": 1, "config": {"path": f"{home}/in/b-*.txt"}},
            ],
            "operators": [
                {"id": "ta", "type": "map", "inputs": ["a"], "fn": "chaosfns:tag_a"},
                {"id": "tb", "type": "map", "inputs": ["b"], "fn": "chaosfns:tag_b", "parallelism": 1},
                {"id": "both", "type": "union", "inputs": ["ta", "tb"]},
                {"id": "by-src", "type": "key_by", "key": {"field": "src"}},
                {"id": "count", "type": "aggregate", "aggregate": "count"},
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
        parallelism=2,
    )


def file_to_file(home: Path) -> dict[str, Any]:
    """A stateless filter and map from files to files."""
    _write(home, _words(random.Random(9), 4, 2000))
    return _job(
        "file-to-file",
        {
            "sources": [_lines(home)],
            "operators": [
                {"id": "keep", "type": "filter", "fn": "chaosfns:long_enough"},
                {"id": "up", "type": "map", "fn": "chaosfns:upper"},
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out", "format": "text"}}],
        },
        parallelism=2,
    )


def minio_to_minio(home: Path, *, client: Any, bucket: str, endpoint: str) -> dict[str, Any]:
    """A rolling word count at parallelism 3 from MinIO to MinIO, checkpoints in MinIO too."""
    for name, text in _words(random.Random(11), 6, 1500).items():
        data = text.encode()
        client.put_object(bucket, f"in/{name}", io.BytesIO(data), len(data))
    s3 = {"endpoint": endpoint, "bucket": bucket}
    return _job(
        "minio-count",
        {
            "sources": [{"id": "lines", "type": "s3", "config": {**s3, "prefix": "in/"}}],
            "operators": rolling_word_count(),
            "sinks": [{"id": "out", "type": "s3", "config": {**s3, "prefix": "out/"}}],
        },
        parallelism=3,
        checkpoint={"intervalMs": 150, "storage": {"s3": {**s3, "prefix": "cp/"}}},
    )


def minio_final_count(home: Path, *, client: Any, bucket: str, endpoint: str) -> dict[str, Any]:
    """Final counts at parallelism 3 over one object of four stripes (every subtask reads a part)."""
    words = [f"w{i}" for i in range(200)]
    rng = random.Random(13)
    data = "".join(" ".join(rng.choices(words, k=60)) + "\n" for _ in range(5000)).encode()
    client.put_object(bucket, "in/big.txt", io.BytesIO(data), len(data))
    s3 = {"endpoint": endpoint, "bucket": bucket}
    return _job(
        "minio-final-count",
        {
            "sources": [{"id": "lines", "type": "s3", "config": {**s3, "prefix": "in/"}}],
            "operators": rolling_word_count(emit="final"),
            "sinks": [{"id": "out", "type": "s3", "config": {**s3, "prefix": "out/"}}],
        },
        parallelism=3,
        checkpoint={"intervalMs": 150, "storage": {"s3": {**s3, "prefix": "cp/"}}},
    )


POSTGRES_TABLES = (
    "CREATE TABLE counts (key text PRIMARY KEY, value bigint NOT NULL)",
    "CREATE TABLE updates (key text NOT NULL, value bigint NOT NULL)",
)


def files_to_postgres(home: Path, *, port: int, user: str, database: str) -> dict[str, Any]:
    """A rolling word count at parallelism 3 into PostgreSQL: every update (insert), the latest (upsert)."""
    _write(home, _words(random.Random(13), 4, 1600))
    pg = {"port": port, "user": user, "database": database, "columns": ["key", "value"]}
    return _job(
        "pg-count",
        {
            "sources": [_lines(home)],
            "operators": rolling_word_count(),
            "sinks": [
                {
                    "id": "latest",
                    "type": "postgres",
                    "inputs": ["count"],
                    "parallelism": 2,
                    "key": {"field": "key"},
                    "config": {**pg, "table": "counts", "mode": "upsert", "keys": ["key"]},
                },
                {
                    "id": "every",
                    "type": "postgres",
                    "inputs": ["count"],
                    "config": {**pg, "table": "updates"},
                },
            ],
        },
        parallelism=3,
    )


def fill_kafka(kafka: Any, rng: random.Random, *, partitions: int = 3, lines: int = 3200) -> str:
    """A topic of JSON-string lines over `partitions`, part in transactions, with aborted ones to skip."""
    topic = kafka.create("lines", partitions=partitions)
    words = [f"w{i}" for i in range(200)]
    for p in range(partitions):
        batch = [" ".join(rng.choices(words, k=6)) for _ in range(lines)]
        kafka.produce(topic, batch[: lines // 2], partition=p)
        kafka.produce(topic, ["aborted line"] * 20, partition=p, transactional=f"{topic}-{p}", abort=True)
        kafka.produce(topic, batch[lines // 2 :], partition=p, transactional=f"{topic}-{p}")
    return topic


def _kafka_count(source: dict[str, Any], sink: dict[str, Any]) -> dict[str, Any]:
    return {
        "sources": [source],
        "operators": rolling_word_count(),
        "sinks": [sink],
    }


def kafka_to_kafka(home: Path, *, kafka: Any, connection: dict[str, Any] | None = None) -> dict[str, Any]:
    """A rolling word count from a 3-partition topic to a 2-partition topic, keyed by word; both
    connecting with `connection` (bootstrap servers and security) when given."""
    source = fill_kafka(kafka, random.Random(15))
    out = kafka.create("counts", partitions=2)
    reach = connection or {"bootstrapServers": kafka.bootstrap}
    src = {**reach, "topic": source, "bounded": True}
    sink = {**reach, "topic": out, "keyField": "key"}
    return _job(
        "kafka-count",
        _kafka_count(
            {"id": "lines", "type": "kafka", "config": src},
            {"id": "out", "type": "kafka", "parallelism": 2, "config": sink},
        ),
        parallelism=3,
    )


ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "user", "type": "string"}, {"name": "amount", "type": "long"}],
}
"""The orders' first schema."""

ORDER_V2 = {
    **ORDER_V1,
    "fields": [
        *ORDER_V1["fields"],
        {"name": "currency", "type": "string", "default": "EUR"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
"""The orders' second schema: two fields more, each with its default (BACKWARD and FORWARD compatible)."""

TOTAL = {
    "type": "record",
    "name": "Total",
    "namespace": "shop",
    "fields": [{"name": "key", "type": "string"}, {"name": "value", "type": "long"}],
}
"""A user's running total."""


def avro_orders(*, partitions: int = 3, per: int = 2000) -> list[list[dict[str, Any]]]:
    """The committed orders of each partition of `fill_avro_orders`, in order: the first half with
    `ORDER_V1`'s fields, the rest with `ORDER_V2`'s. A user's orders are all in one partition, so
    its running totals do not depend on how the partitions interleave."""
    rng = random.Random(23)
    out = []
    for p in range(partitions):
        users = [f"p{p}-u{i}" for i in range(20)]
        orders = [{"user": rng.choice(users), "amount": rng.randrange(1, 1000)} for _ in range(per)]
        later = [
            {**o, "currency": "USD", "note": "v2" if o["amount"] % 2 else None} for o in orders[per // 2 :]
        ]
        out.append(orders[: per // 2] + later)
    return out


def fill_avro_orders(kafka: Any, registry: Any, orders: list[list[dict[str, Any]]]) -> str:
    """A topic of `avro_orders` in Avro, a partition each: the first half of each partition written
    with `ORDER_V1`, the rest with `ORDER_V2` (registered in between, as a producer upgraded
    mid-stream does; the subject's rule is FULL), the second half in a transaction after an aborted
    one."""
    from tests.registry_util import avro_value

    topic = kafka.create("orders", partitions=len(orders))
    subject = f"{topic}-value"
    v1 = registry.register(subject, ORDER_V1)
    registry.compatibility(subject, "FULL")
    halves = [len(part) // 2 for part in orders]
    for p, part in enumerate(orders):
        kafka.produce(topic, [avro_value(v1, ORDER_V1, o) for o in part[: halves[p]]], partition=p, raw=True)
    v2 = registry.register(subject, ORDER_V2)
    assert registry.versions(subject) == [1, 2]
    for p, part in enumerate(orders):
        aborted = [avro_value(v2, ORDER_V2, {**o, "amount": 10**9}) for o in part[halves[p] : halves[p] + 20]]
        kafka.produce(topic, aborted, partition=p, raw=True, transactional=f"{topic}-{p}", abort=True)
        values = [avro_value(v2, ORDER_V2, o) for o in part[halves[p] :]]
        kafka.produce(topic, values, partition=p, raw=True, transactional=f"{topic}-{p}")
    return topic


def kafka_avro_totals(
    home: Path, *, kafka: Any, registry: Any, connection: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Each user's running total of the Avro orders of `fill_avro_orders` into an Avro topic of
    `TOTAL`s, registered by the sink; both ends connect with `connection` when given."""
    source = fill_avro_orders(kafka, registry, avro_orders())
    out = kafka.create("totals", partitions=2)
    reach = connection or {"bootstrapServers": kafka.bootstrap}
    avro = {"format": "avro", "schemaRegistry": {"url": registry.url}}
    return _job(
        "kafka-avro",
        {
            "sources": [
                {
                    "id": "orders",
                    "type": "kafka",
                    "config": {**reach, **avro, "topic": source, "bounded": True},
                }
            ],
            "operators": [
                {"id": "paced", "type": "map", "fn": "chaosfns:slow"},
                {"id": "by-user", "type": "key_by", "key": {"field": "user"}},
                {"id": "total", "type": "aggregate", "aggregate": {"kind": "sum", "field": "amount"}},
            ],
            "sinks": [
                {
                    "id": "out",
                    "type": "kafka",
                    "parallelism": 2,
                    "config": {
                        **reach,
                        **avro,
                        "topic": out,
                        "keyField": "key",
                        "valueSchema": json.dumps(TOTAL),
                    },
                }
            ],
        },
        parallelism=3,
    )


def kafka_to_postgres(home: Path, *, kafka: Any, port: int, user: str, database: str) -> dict[str, Any]:
    """A rolling word count from a topic to the latest count per word in PostgreSQL (upsert)."""
    source = fill_kafka(kafka, random.Random(17), lines=1600)  # two subtasks read the three partitions
    src = {"bootstrapServers": kafka.bootstrap, "topic": source, "bounded": True}
    pg = {"port": port, "user": user, "database": database, "columns": ["key", "value"]}
    return _job(
        "kafka-pg",
        _kafka_count(
            {"id": "lines", "type": "kafka", "config": src},
            {
                "id": "latest",
                "type": "postgres",
                "parallelism": 2,
                "key": {"field": "key"},
                "config": {**pg, "table": "counts", "mode": "upsert", "keys": ["key"]},
            },
        ),
        parallelism=2,
    )


def row_key_of(change: dict[str, Any]) -> str:
    """The row a change is of, as `chaosfns:row_key` says it."""
    row = change["after"] or change["before"]
    return f"{change['table']}:{row['id']}"


def change_rows(conn: Any, rng: random.Random, *, rows: int = 1500, first: int = 0) -> int:
    """Inserts (ids from `first`), updates and deletes of `items` (REPLICA IDENTITY FULL), in
    transactions of a few to a hundred changes: what a `postgres-cdc` source of the table reads; how
    many changes."""
    conn.execute("CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY, qty int, note text)")
    conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")
    live: list[int] = []
    changes = 0
    for start in range(first, first + rows, 100):
        with conn.transaction():
            conn.execute(
                "INSERT INTO items SELECT i, i %% 7, 'n' || i FROM generate_series(%s::int, %s::int) i",
                (start, start + 99),
            )
        live += range(start, start + 100)
        for _ in range(20):
            with conn.transaction():
                for _ in range(rng.randint(1, 5)):
                    conn.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (rng.choice(live),))
                    changes += 1
        with conn.transaction():
            for gone in rng.sample(live, 10):
                live.remove(gone)
                conn.execute("DELETE FROM items WHERE id = %s", (gone,))
        changes += 100 + 10
    return changes


def postgres_cdc(source: dict[str, Any], per_row: dict[str, Any], *, bounded: bool = True) -> dict[str, Any]:
    """The changes of a `postgres-cdc` source, paced, into the file sink `out` (each change once), and
    the rolling count of changes per row into the sink `per_row` (its type and config; keyed by row,
    at parallelism 2)."""
    return _job(
        "pg-cdc",
        {
            "sources": [{"id": "changes", "type": "postgres-cdc", "config": {**source, "bounded": bounded}}],
            "operators": [
                {"id": "paced", "type": "map", "fn": "chaosfns:slow"},
                {"id": "by-row", "type": "key_by", "key": {"fn": "chaosfns:row_key"}},
                {"id": "count", "type": "aggregate", "aggregate": "count"},
            ],
            "sinks": [
                {"id": "every", "type": "file", "inputs": ["paced"], "config": {"path": "out"}},
                {"id": "per-row", "inputs": ["count"], "parallelism": 2, "key": {"field": "key"}, **per_row},
            ],
        },
        parallelism=2,
    )


SHAPES: dict[str, Callable[..., dict[str, Any]]] = {
    "rolling-count": rolling_count,
    "late-windows": windows,
    "cep": cep,
    "union": union,
    "reminders": reminders,
    "enrichment": enrichment,
    "joins": joins,
    "broadcast-rules": broadcast_rules,
    "dead-letters": dead_letters,
}
CHAOS_ARGS: dict[str, tuple[str, ...]] = {"dead-letters": ("--pace", "300")}
"""`nopstream chaos` arguments of a shape beyond the matrix's own."""
NOT_ITS_STEPS: dict[str, set[str]] = {
    shape: {"during-alignment"} for shape in ("dead-letters", "late-windows", "reminders")
}
"""Fault points of protocol steps a shape does not have: each task of these reads one channel (a
source and a map at parallelism 1 before a keyed operator and its sinks at 2), so no barrier is
ever aligned."""


def _write(home: Path, inputs: dict[str, str]) -> None:
    (home / "in").mkdir(parents=True, exist_ok=True)
    for name, text in inputs.items():
        (home / "in" / name).write_text(text)


def _write_jsonl(home: Path, inputs: dict[str, list[dict[str, Any]]]) -> None:
    _write(home, {name: "".join(json.dumps(r) + "\n" for r in records) for name, records in inputs.items()})


def prepare(home: Path, model: dict[str, Any]) -> Path:
    """Write the job file and its functions module into `home`; the job file's path."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "chaosfns.py").write_text(textwrap.dedent(FNS))
    path = home / "job.yaml"
    path.write_text(yaml.safe_dump(model, sort_keys=False))
    return path


def processing_windows(home: Path) -> dict[str, Any]:
    """Word counts in 100 ms processing-time windows: their bounds are wall-clock times, so two runs
    always differ, with or without a fault."""
    _write(home, _words(random.Random(13), 2, 1000))
    return _job(
        "processing-windows",
        {
            "sources": [_lines(home)],
            "operators": [
                {"id": "split", "type": "flat_map", "fn": "chaosfns:split"},
                {
                    "id": "count",
                    "type": "window",
                    "key": {"fn": "chaosfns:word"},
                    "aggregate": "count",
                    "window": {"kind": "tumbling", "time": "processing", "sizeMs": 100},
                },
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
        parallelism=2,
    )


def _orders_count(
    job_id: str, home: Path, ext: str, source: dict[str, Any], sink: dict[str, Any]
) -> dict[str, Any]:
    """Orders in the files `home/in/*.{ext}` (read as `source` says) into each user's rolling count of
    orders, written as `sink` says, at parallelism 3 and 2."""
    return _job(
        job_id,
        {
            "sources": [{"id": "orders", "type": "file", "config": {"path": f"{home}/in/*.{ext}", **source}}],
            "operators": [
                {"id": "paced", "type": "map", "fn": "chaosfns:slow"},
                {"id": "by-user", "type": "key_by", "key": {"field": "user"}},
                {"id": "count", "type": "aggregate", "aggregate": "count"},
            ],
            "sinks": [{"id": "out", "type": "file", "parallelism": 2, "config": {"path": "out", **sink}}],
        },
        parallelism=3,
    )


def csv_to_csv(home: Path) -> dict[str, Any]:
    """Orders in CSV files (about two stripes each, a header on the first) into each user's rolling
    count of orders, written as CSV files of `key,value`."""
    rng = random.Random(29)
    for f in range(3):
        rows = "".join(f'u{rng.randrange(40)},{rng.randrange(1, 1000)},"note, {i}"\n' for i in range(12_000))
        _write(home, {f"orders-{f}.csv": "user,amount,note\n" + rows})
    sink = {"format": "csv", "csv": {"columns": ["key", "value"]}}
    return _orders_count("csv-count", home, "csv", {"format": "csv"}, sink)


def parquet_to_parquet(home: Path) -> dict[str, Any]:
    """Orders in Parquet files (row groups of 500 rows: 24 per file) into each user's rolling count
    of orders, written as Parquet files in row groups of 64 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(31)
    (home / "in").mkdir(parents=True, exist_ok=True)
    for f in range(3):
        orders = [{"user": f"u{rng.randrange(40)}", "amount": rng.randrange(1, 1000)} for _ in range(12_000)]
        pq.write_table(pa.Table.from_pylist(orders), home / "in" / f"orders-{f}.parquet", row_group_size=500)
    columns = [{"name": "key", "type": "string"}, {"name": "value", "type": "int64"}]
    sink = {"format": "parquet", "parquet": {"schema": columns, "rowGroupRows": 64}}
    return _orders_count("parquet-count", home, "parquet", {"format": "parquet"}, sink)


def file_to_file_mapping_with(home: Path, name: str, body: str) -> Path:
    """The file-to-file job whose map is the function `name(line)` with `body`, prepared in `home`."""
    model = file_to_file(home)
    model["model"]["operators"][1]["fn"] = f"chaosfns:{name}"
    job = prepare(home, model)
    fns = home / "chaosfns.py"
    fns.write_text(f"{fns.read_text()}\n\ndef {name}(line):\n    {body}\n")
    return job
