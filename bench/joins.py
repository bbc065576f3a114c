"""Join throughput and state: interval and temporal joins against a plain Python dict join, in one run.

Left: the generator's `events` (`{"key": "k{i mod keys}", "value": i, "ts": 10 i}`), N
records; right: the same kind, N / 5 records whose timestamps are 50 i, so both cover the
same event time. Rows, records (left and right) per second, each as a ratio to the
baseline measured in the same run:
  baseline        one Python loop over both inputs in timestamp order with a dict of each
                  key's held records: interval pairs within [lowerMs, upperMs], records
                  dropped past their bound; temporal: each left record with its key's latest
                  version (what nopstream computes, without channels, checkpoints or files)
  interval p1, p2 `nopstream run` (one process per task), a full interval join
  temporal p1, p2 the same, a left temporal join
Each row is run `--repeat` times, the rows taking turns, and shows its median with its
lowest and highest ratio (a shared machine varies by tens of percent). Target (issue 31):
>= 0.4 at parallelism 1. Every run's output is checked against the baseline's count.
State: the interval join over a paced generator for `--seconds`, checkpoints every 500 ms:
the join's segment bytes per durable epoch in the first and the last quarter of the run
(medians) and their ratio; its state is bounded by the interval, so it must stay flat (~1).
Then the same for a keyed process counting records per key over ever-new keys (1,000 at a
time, a new generation every 20,000 records), with `stateTtlMs` (flat: the old keys expire)
and without (growing: every generation stays).
Run: `python bench/joins.py [--records N] [--repeat 3] [--seconds 40]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from runs import processing_seconds, write_job  # bench/runs.py: run as a script, bench/ is on the path

KEYS = 2000
LOWER, UPPER = -300, 200
TTL_MS = 10_000
FNS = """
def right_ts(record):
    return 50 * record["value"]

def generation(record):
    # 1,000 keys at a time; a new set every 20,000 records (200 s of event time)
    return f"g{record['value'] // 20_000}-{record['value'] % 1000}"

class Count:
    def process(self, record, ctx):
        ctx.set_value("n", ctx.value("n", 0) + 1)
        return []
"""


def events(count: int, step: int) -> list[dict[str, Any]]:
    """The generator's `events` records, with timestamps `step` ms apart."""
    return [{"key": f"k{i % KEYS}", "value": i, "ts": step * i} for i in range(count)]


def baseline(kind: str, records: int) -> tuple[float, int]:
    """Seconds and rows of the plain Python join over both inputs in timestamp order."""
    lefts, rights = events(records, 10), events(records // 5, 50)
    started = time.perf_counter()
    # a version at a left record's time applies to it: rights first at equal timestamps
    merged = sorted(
        [(r["ts"], 0, 1, r) for r in rights] + [(r["ts"], 1, 0, r) for r in lefts], key=lambda t: t[:2]
    )
    rows: list[dict[str, Any]] = []
    if kind == "temporal":
        latest: dict[str, dict[str, Any]] = {}
        for _, _, side, record in merged:
            if side:
                latest[record["key"]] = record
            else:
                rows.append({"key": record["key"], "left": record, "right": latest.get(record["key"])})
        return time.perf_counter() - started, len(rows)
    held: tuple[dict[str, list[list[Any]]], dict[str, list[list[Any]]]] = ({}, {})
    for ts, _, side, record in merged:
        key, mine, kept = record["key"], [ts, record, False], []
        for entry in held[1 - side].get(key, ()):
            if (entry[0] + UPPER if side else entry[0] - LOWER) < ts:  # past its bound: dropped
                if not entry[2]:
                    rows.append({"key": key, "unmatched": entry[1]})
                continue
            kept.append(entry)
            if LOWER <= (ts - entry[0] if side else entry[0] - ts) <= UPPER:
                entry[2] = mine[2] = True
                rows.append(
                    {"key": key, "left": entry[1] if side else record, "right": record if side else entry[1]}
                )
        held[1 - side][key] = kept
        held[side].setdefault(key, []).append(mine)
    rows += [
        {"key": k, "unmatched": e[1]}
        for side in held
        for k, entries in side.items()
        for e in entries
        if not e[2]
    ]
    return time.perf_counter() - started, len(rows)


def job(
    workdir: Path, name: str, kind: str, parallelism: int, records: int, *, rate: int | None = None
) -> Path:
    """Two generator sources of events into one join (kind interval or temporal), or one into a
    process counting per generation key (kind ttl or no-ttl), its rows into a file sink."""
    operator: dict[str, Any] = {
        "id": "j",
        "type": "join",
        "inputs": ["left", "right"],
        "key": {"field": "key"},
    }
    if kind == "interval":
        operator["join"] = {"kind": "interval", "how": "full", "lowerMs": LOWER, "upperMs": UPPER}
    elif kind == "temporal":
        operator["join"] = {"kind": "temporal", "how": "left"}
    else:
        operator = {
            "id": "j",
            "type": "process",
            "inputs": ["left"],
            "key": {"fn": "benchjoins:generation"},
            "fn": "benchjoins:Count",
        } | ({"stateTtlMs": TTL_MS} if kind == "ttl" else {})

    def source(side: str, count: int, watermark: dict[str, Any]) -> dict[str, Any]:
        config: dict[str, Any] = {"kind": "events", "count": count, "keys": KEYS}
        if rate is not None:
            config["ratePerSecond"] = rate if side == "left" else rate // 5
        return {"id": side, "type": "generator", "config": config, "watermark": watermark}

    model = {
        "jobId": name,
        "parallelism": parallelism,
        "checkpoint": {
            "intervalMs": 500,
            "retainLatest": 1000,
            "storage": {"local": {"path": str(workdir / f"cp-{name}")}},
        },
        "model": {
            "sources": [
                source("left", records, {"timestampField": "ts"}),
                source("right", records // 5, {"timestampFn": "benchjoins:right_ts"}),
            ][: len(operator["inputs"])],
            "operators": [operator],
            "sinks": [{"id": "out", "type": "file", "config": {"path": str(workdir / f"out-{name}")}}],
        },
    }
    return write_job(workdir, name, model)


def rows_written(directory: Path) -> int:
    """The rows of every committed file of a file sink."""
    return sum(f.read_text().count("\n") for f in directory.glob("*.jsonl"))


def state_bytes(workdir: Path, name: str) -> list[int]:
    """The join's segment bytes of each durable epoch before the final one, in epoch order."""
    sizes = []
    for manifest in (workdir / f"cp-{name}").rglob("_manifest.json"):
        data = json.loads(manifest.read_text())
        if data["kind"] == "final":  # after the end of input: nothing held
            continue
        join = sum(s["bytes"] for task, t in data["tasks"].items() if "/j/" in task for s in t["segments"])
        sizes.append((int(data["epoch"]), join))
    return [b for _, b in sorted(sizes)]


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000, help="left records (the right has a fifth)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=40, help="length of the state run")
    args = parser.parse_args()
    total = args.records + args.records // 5
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "benchjoins.py").write_text(FNS)
        rows = {(kind, p): [] for kind in ("interval", "temporal") for p in (1, 2)}
        ratios: dict[tuple[str, int], list[float]] = {row: [] for row in rows}
        base: dict[str, list[float]] = {"interval": [], "temporal": []}
        for turn in range(args.repeat):
            for kind in ("interval", "temporal"):
                seconds, expected = baseline(kind, args.records)
                base[kind].append(total / seconds)
                for p in (1, 2):
                    name = f"{kind}-p{p}-{turn}"
                    elapsed = processing_seconds(workdir, job(workdir, name, kind, p, args.records))
                    written = rows_written(workdir / f"out-{name}")
                    assert written == expected, f"{name}: {written} rows, the baseline has {expected}"
                    rows[(kind, p)].append(total / elapsed)
                    ratios[(kind, p)].append(total / elapsed / (total / seconds))
        print(
            f"records: {args.records:,} left + {args.records // 5:,} right, {KEYS} keys, {args.repeat} turns"
        )
        for kind in ("interval", "temporal"):
            print(f"  {kind + ' baseline':<22} {statistics.median(base[kind]):>12,.0f} records/s")
            for p in (1, 2):
                r = ratios[(kind, p)]
                print(
                    f"  {kind + f' p{p}':<22} {statistics.median(rows[(kind, p)]):>12,.0f} records/s"
                    f"  ratio {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"
                    + ("  target >= 0.4" if p == 1 else "")
                )
        rate = 5_000
        for kind, what, shape in (
            ("interval", "interval join", "flat: ~1"),
            ("ttl", f"process, stateTtlMs {TTL_MS:,}", "flat: ~1"),
            ("no-ttl", "process, no TTL", "grows"),
        ):
            name = f"state-{kind}"
            started = time.monotonic()
            processing_seconds(workdir, job(workdir, name, kind, 2, rate * args.seconds, rate=rate))
            sizes = state_bytes(workdir, name)
            quarter = max(1, len(sizes) // 4)
            first, last = statistics.median(sizes[:quarter]), statistics.median(sizes[-quarter:])
            print(
                f"state: {what} at {rate:,} records/s for {time.monotonic() - started:.0f} s,"
                f" {len(sizes)} durable epochs kept: segments {first:,.0f} bytes per epoch in the first"
                f" quarter, {last:,.0f} in the last, ratio {last / max(first, 1):.2f} ({shape})"
            )


if __name__ == "__main__":
    main()
