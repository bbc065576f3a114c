"""Async operator throughput against a lookup service of 5 ms latency, in one run.

The service is `tests/lookup_server.py` (aiohttp on loopback, in this process's thread,
answering each request after 5 ms). N records are each given their score by one HTTP
request; records per second, each as a ratio to the baseline measured in the same run:
  baseline c     one asyncio loop doing the same N requests with `c` in flight at once
                 (`c` workers over one aiohttp session), in a process of its own as the
                 job's task is (the service's thread shares this one's interpreter)
  async_map c    `nopstream run` (one process per task, parallelism 1): a file source, an
                 `async_map` of capacity `c`, a file sink, exactly once with checkpoints
for c = 1, 10 and 100. Each row runs `--repeat` times, the rows taking turns, and shows its
median with its lowest and highest ratio. Target (issue 32): >= 0.7 at capacity 100. Every
run's output is checked: N records, each with its score.
Run: `python bench/async.py [--records N] [--repeat 3]` (a script: `async` is a keyword, so it
is never imported by that name).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from runs import processing_seconds, write_job  # bench/runs.py: run as a script, bench/ is on the path

from tests.lookup_server import FNS, LookupServer, lookup_server

LATENCY = 0.005
CAPACITIES = (1, 10, 100)


def baseline(url: str, records: int, capacity: int) -> float:
    """Seconds for `records` lookups with `capacity` in flight, in a process of its own."""
    args = [sys.executable, __file__, "--baseline-of", url, str(records), str(capacity)]
    return float(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


async def lookups(url: str, records: int, capacity: int) -> float:
    """Seconds for `records` lookups with `capacity` in flight, in one asyncio loop."""
    turns = iter(range(records))
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            for n in turns:
                async with session.get(url + "/score", params={"id": n}) as response:
                    response.raise_for_status()
                    await response.json()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(capacity)))
        return time.perf_counter() - started


def job(workdir: Path, name: str, capacity: int, records: Path) -> Path:
    """The job file of one run: `records` -> async_map(score) -> file."""
    model = {
        "jobId": name,
        "parallelism": 1,
        "checkpoint": {"intervalMs": 500, "storage": {"local": {"path": str(workdir / f"cp-{name}")}}},
        "model": {
            "sources": [
                {"id": "records", "type": "file", "config": {"path": str(records), "format": "jsonl"}}
            ],
            "operators": [
                {
                    "id": "scored",
                    "type": "async_map",
                    "fn": "benchasync:score",
                    "async": {"capacity": capacity},
                }
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": str(workdir / f"out-{name}")}}],
        },
    }
    return write_job(workdir, name, model)


def checked(directory: Path, records: int) -> None:
    """Every record once, with its score."""
    got = [json.loads(line) for f in directory.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(r["id"] for r in got) == list(range(records)), f"{directory}: {len(got)} records"
    assert all(r["score"] == r["id"] * 7 % 100 for r in got)


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--baseline-of", nargs=3, metavar=("URL", "RECORDS", "CAPACITY"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.baseline_of:  # the baseline's own process: print its seconds
        url, records, capacity = args.baseline_of
        print(asyncio.run(lookups(url, int(records), int(capacity))))
        return
    rates: dict[str, list[float]] = {
        f"{row} {c}": [] for c in CAPACITIES for row in ("baseline", "async_map")
    }
    ratios: dict[int, list[float]] = {c: [] for c in CAPACITIES}
    with (
        tempfile.TemporaryDirectory() as tmp,
        lookup_server(LookupServer(latency=lambda n: LATENCY)) as server,
    ):
        workdir = Path(tmp)
        (workdir / "benchasync.py").write_text(FNS.format(url=server.url))
        inputs = {}
        for records in (args.records, args.records // 10):  # one at a time is slow: a tenth of them
            inputs[records] = workdir / f"records-{records}.jsonl"
            inputs[records].write_text("".join(f'{{"id": {n}}}\n' for n in range(records)))
        for turn in range(args.repeat):
            for c in CAPACITIES:
                records = args.records if c > 1 else args.records // 10
                base = records / baseline(server.url, records, c)
                name = f"c{c}-{turn}"
                path = job(workdir, name, c, inputs[records])
                rate = records / processing_seconds(workdir, path)
                checked(workdir / f"out-{name}", records)
                rates[f"baseline {c}"].append(base)
                rates[f"async_map {c}"].append(rate)
                ratios[c].append(rate / base)
    print(
        f"records: {args.records:,} (a tenth at capacity 1), service latency {LATENCY * 1000:.0f} ms,"
        f" {args.repeat} turns"
    )
    for c in CAPACITIES:
        r = ratios[c]
        print(f"  {f'baseline {c}':<16} {statistics.median(rates[f'baseline {c}']):>10,.0f} records/s")
        print(
            f"  {f'async_map {c}':<16} {statistics.median(rates[f'async_map {c}']):>10,.0f} records/s"
            f"  ratio {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"
            + ("  target >= 0.7" if c == 100 else "")
        )


if __name__ == "__main__":
    main()
