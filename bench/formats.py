"""Object formats: a copy of orders from files into files in JSON lines, CSV and Parquet, nopstream
against a plain Python loop reading and writing the same format, as ratios measured in one run.

Input: `--rows` orders (`order`, `user`, `amount`, `ts`; fixed seed) in 4 files of each
format (Parquet in row groups of 50,000 rows). Job: the file source into the file sink
in the same format (`emit` everything, parallelism 1, checkpoints every second), so
what is measured is reading, the channels and writing, not operators. The plain loop
does the same reading and writing with the same libraries and nothing else: orjson per
line; Python's `csv` module with `amount` and `ts` typed; pyarrow reading a whole file
into records and writing them in row groups of 65,536. Rows: records per second of the
loop and of nopstream's processing (the time from the tasks being up to the end), and
nopstream / loop; each format is run `--repeat` times taking turns, figures are medians.
Run: `python bench/formats.py [--rows N] [--repeat 3]`.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from nopstream.connectors.files import committed_records
from nopstream.connectors.parquet_values import records_of
from nopstream.local import runner
from nopstream.model.load import load_file
from nopstream.plan import compiler

FILES = 4
COLUMNS = ["order", "user", "amount", "ts"]
TYPES = {"order": "int64", "user": "string", "amount": "int64", "ts": "int64"}


def orders(rows: int) -> list[dict]:
    rng = random.Random(7)
    return [
        {
            "order": i,
            "user": f"u{rng.randrange(10_000)}",
            "amount": rng.randrange(1, 10_000),
            "ts": 1_700_000_000_000 + i,
        }
        for i in range(rows)
    ]


def write_inputs(directory: Path, records: list[dict]) -> None:
    """The orders in FILES files of each format."""
    for fmt in ("jsonl", "csv", "parquet"):
        (directory / fmt).mkdir(parents=True)
    for i in range(FILES):
        part = records[i::FILES]
        (directory / "jsonl" / f"o{i}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in part))
        text = io.StringIO()
        writer = csv.DictWriter(text, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(part)
        (directory / "csv" / f"o{i}.csv").write_text(text.getvalue())
        pq.write_table(
            pa.Table.from_pylist(part), directory / "parquet" / f"o{i}.parquet", row_group_size=50_000
        )


def loop_jsonl(src: Path, out: Path) -> int:
    n = 0
    for path in sorted(src.glob("*.jsonl")):
        with open(path, "rb") as f:
            records = [orjson.loads(line) for line in f]
        (out / path.name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        n += len(records)
    return n


def loop_csv(src: Path, out: Path) -> int:
    n = 0
    for path in sorted(src.glob("*.csv")):
        with open(path, newline="") as f:
            records = [{**r, "amount": int(r["amount"]), "ts": int(r["ts"])} for r in csv.DictReader(f)]
        with open(out / path.name, "w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(records)
        n += len(records)
    return n


def loop_parquet(src: Path, out: Path) -> int:
    n = 0
    schema = pa.schema([(c, pa.string() if t == "string" else pa.int64()) for c, t in TYPES.items()])
    for path in sorted(src.glob("*.parquet")):
        records = records_of(pq.read_table(path))
        pq.write_table(pa.Table.from_pylist(records, schema=schema), out / path.name, row_group_size=65_536)
        n += len(records)
    return n


LOOPS: dict[str, Callable[[Path, Path], int]] = {
    "jsonl": loop_jsonl,
    "csv": loop_csv,
    "parquet": loop_parquet,
}


def job(workdir: Path, fmt: str, name: str) -> Path:
    """The copy job of `fmt` files, its own id and output."""
    source: dict = {"path": str(workdir / "in" / fmt / f"*.{fmt}"), "format": fmt}
    sink: dict = {"path": str(workdir / f"out-{name}"), "format": fmt}
    if fmt == "csv":
        source["csv"] = {"types": {"order": "int", "amount": "int", "ts": "int"}}
        sink["csv"] = {"columns": COLUMNS}
    if fmt == "parquet":
        sink["parquet"] = {"schema": [{"name": c, "type": t} for c, t in TYPES.items()]}
    spec = {
        "jobId": f"bench-{name}",
        "parallelism": 1,
        "checkpoint": {"intervalMs": 1000},
        "model": {
            "sources": [{"id": "orders", "type": "file", "config": source}],
            "operators": [],
            "sinks": [{"id": "out", "type": "file", "config": sink}],
        },
    }
    path = workdir / f"job-{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run(workdir: Path, path: Path) -> runner.RunResult:
    plans = compiler.compile_model(load_file(path), backend="local")
    options = runner.RunOptions(quiet=True, workdir=workdir / ".nopstream", python_path=(str(workdir),))
    return runner.run_job(plans, options)


def main() -> None:
    """Measure and print the ratios."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    loops: dict[str, list[float]] = {f: [] for f in LOOPS}
    jobs: dict[str, list[float]] = {f: [] for f in LOOPS}
    before = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        os.chdir(workdir)  # a job's checkpoints go under the working directory
        write_inputs(workdir / "in", orders(args.rows))
        for turn in range(args.repeat):
            for fmt, loop in LOOPS.items():
                out = workdir / f"loop-{fmt}-{turn}"
                out.mkdir()
                start = time.perf_counter()
                copied = loop(workdir / "in" / fmt, out)
                loops[fmt].append(time.perf_counter() - start)
                if copied != args.rows:
                    raise SystemExit(f"the {fmt} loop copied {copied} records, not {args.rows}")
                path = job(workdir, fmt, f"{fmt}-{turn}")
                result = run(workdir, path)
                sink = yaml.safe_load(path.read_text())["model"]["sinks"][0]["config"]
                written = len(committed_records(sink))
                if written != args.rows:
                    raise SystemExit(f"the {fmt} job wrote {written} records, not {args.rows}")
                jobs[fmt].append(result.processing_seconds)
        os.chdir(before)
    rows = args.rows
    print(f"orders: {rows:,} in {FILES} files of each format; each row run {args.repeat} times: medians")
    print(f"machine: {os.cpu_count()} cores")
    print(f"{'format':<10} {'plain loop':>16} {'nopstream':>16} {'nopstream / loop':>18}")
    speed = {}
    for fmt in LOOPS:
        loop, ours = statistics.median(loops[fmt]), statistics.median(jobs[fmt])
        speed[fmt] = rows / ours
        print(f"{fmt:<10} {rows / loop:>12,.0f} r/s {rows / ours:>12,.0f} r/s {loop / ours:>18.3f}")
    parquet, csv_ = speed["parquet"] / speed["jsonl"], speed["csv"] / speed["jsonl"]
    print(f"nopstream parquet / jsonl: {parquet:.3f}, csv / jsonl: {csv_:.3f}")


if __name__ == "__main__":
    main()
