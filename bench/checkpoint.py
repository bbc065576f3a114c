"""Checkpoint costs: throughput with epochs every second against one, recovery time, bytes per epoch.

Word count (rolling counts, so every epoch commits output) over a generated corpus,
task processes at parallelism 2. Printed, each from this one run:
  ratio      processing words/s with `intervalMs: 1000` / with one epoch at the end
             (the medians of `--repeat` runs each, the two taking turns, since one run's
             time varies by tens of percent on a shared machine; target >= 0.95:
             checkpoints cost at most 5 %), with the ratio of each turn beside it
  recovery   seconds from a SIGKILL of a task process to the first output file of an
             epoch the recovered run made, the median of `--repeat` jobs with the lowest
             and highest beside it (target < 1 s locally, issue 36)
  bytes      segment bytes per epoch (median over the durable epochs kept)
Run: `python bench/checkpoint.py [--words N] [--repeat 5]`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import processing_seconds, write_job
from throughput import prepared  # the same corpus and functions as bench/throughput.py

ROOT = Path(__file__).resolve().parent.parent


def job(workdir: Path, name: str, interval_ms: int) -> Path:
    """The word-count job with rolling counts and the given epoch interval."""
    spec = {
        "jobId": name,
        "parallelism": 2,
        "checkpoint": {
            "intervalMs": interval_ms,
            "storage": {"local": {"path": str(workdir / f"cp-{name}")}},
        },
        "model": {
            "sources": [
                {"id": "lines", "type": "file", "config": {"path": str(workdir / "corpus" / "*.txt")}}
            ],
            "operators": [
                {"id": "split", "type": "flat_map", "fn": "benchfns:split"},
                {"id": "by-word", "type": "key_by", "key": {"fn": "benchfns:word"}},
                {"id": "count", "type": "aggregate", "aggregate": "count"},
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": str(workdir / f"out-{name}")}}],
        },
    }
    return write_job(workdir, name, spec)


def recovery(workdir: Path, name: str) -> float | None:
    """Seconds from killing a task process of job `name` to the first output the recovered run
    commits; None when the job ended before a task could be killed or before it recovered."""
    path = job(workdir, name, 500)
    out = workdir / f"out-{name}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(workdir)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", str(path)],
        cwd=workdir,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    recovering = threading.Event()

    def watch() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("recovering: "):
                recovering.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        while not list(out.glob("*.jsonl")):  # the first epoch committed
            if proc.poll() is not None:
                return None
            time.sleep(0.02)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        if not children:
            return None
        os.kill(int(children[-1]), signal.SIGKILL)
        killed = time.monotonic()
        if not recovering.wait(60):  # the old run is over: nothing it had in flight can commit any more
            return None
        durable = max(int(m.parent.name) for m in (workdir / f"cp-{name}").rglob("_manifest.json"))

        def epoch_of(f: Path) -> int:
            return int(f.stem.rsplit(".", 1)[1])  # {job}.{pipeline}.l{lineage}.{sink}.{subtask}.{epoch}

        # the restore re-commits what was durable; wait for output of an epoch the new run made
        while not any(epoch_of(f) > durable for f in out.glob("*.jsonl")):
            if proc.poll() is not None:
                return None
            time.sleep(0.02)
        return time.monotonic() - killed
    finally:
        proc.wait(300)


def bytes_per_epoch(workdir: Path, name: str) -> int:
    """Median segment bytes of the durable epochs kept for a job."""
    sizes = []
    for manifest in (workdir / f"cp-{name}").rglob("_manifest.json"):
        data = json.loads(manifest.read_text())
        sizes.append(sum(s["bytes"] for t in data["tasks"].values() for s in t["segments"]))
    return int(statistics.median(sizes)) if sizes else 0


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--words", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each, taking turns (default 5)")
    args = parser.parse_args()
    with prepared(args.words) as workdir:
        offs, ons = [], []  # each run starts from empty storage
        for i in range(args.repeat):
            offs.append(processing_seconds(workdir, job(workdir, f"off-{i}", 3_600_000)))
            ons.append(processing_seconds(workdir, job(workdir, f"on-{i}", 1_000)))
        recoveries = [recovery(workdir, f"recovery-{i}") for i in range(args.repeat)]
        per_epoch = bytes_per_epoch(workdir, "on-0")
    off, on = statistics.median(offs), statistics.median(ons)
    turns = " ".join(f"{a / b:.2f}" for a, b in zip(offs, ons, strict=True))
    print(f"word count, {args.words:,} words, rolling counts, task processes at parallelism 2")
    print(
        f"checkpoints every 1 s: {args.words / on:,.0f} words/s;"
        f" one epoch at the end: {args.words / off:,.0f} words/s (medians of {args.repeat});"
        f" ratio {off / on:.3f} (target >= 0.95; each turn: {turns})"
    )
    measured = [s for s in recoveries if s is not None]
    if len(measured) < len(recoveries):
        print(
            f"recovery: {len(recoveries) - len(measured)} of {len(recoveries)} not measured"
            " (the job ended before a killed task had recovered; use more --words)"
        )
    if measured:
        print(
            f"recovery: {statistics.median(measured):.2f} s from SIGKILL to the next committed output"
            f" (median of {len(measured)}; lowest {min(measured):.2f}, highest {max(measured):.2f};"
            " target < 1 s)"
        )
    print(f"bytes written per epoch: {per_epoch:,} (median of the durable epochs kept)")


if __name__ == "__main__":
    main()
