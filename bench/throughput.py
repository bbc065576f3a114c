"""Word-count throughput: nopstream against a plain Python loop, as ratios measured in one run.

Corpus: lines of 10 words from a 10,000-word vocabulary (fixed seed), 8 million words
by default, in 16 files; final counts (`emit: final`). "processing" is the time from
the moment every task is up to the end; "whole run" adds starting the tasks (forking
them, connecting channels). Rows, each as words per second and as a ratio to the
baseline measured in the same run:
  baseline                  a single-process Python loop counting words with a dict
  in-process, parallelism 1 `nopstream run --in-process`
  processes, parallelism N  `nopstream run` (one process per task), N = 1, 2, 4, 8, 16
  ... combine: false        the same without pre-aggregation before the shuffle
Targets (issue "Parallel speed"): processes p2 >= 0.8, in-process p1 >= 0.5, p4 not
slower than p2. Last, how many files each source subtask read: a file goes to the
subtask its path hashes to, and the corpus's path changes every run, so the balance
(and with it the p2 and p4 rows) changes from run to run.
Run: `python bench/throughput.py [--words N] [--parallelism 1,2,4,8,16]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import yaml

from nopstream.connectors.files import FileSource
from nopstream.local import runner
from nopstream.model.load import load_file
from nopstream.plan import compiler

FNS = """
def split(line):
    return line.split()

def word(w):
    return w
"""


def make_corpus(directory: Path, words: int, *, files: int = 16, seed: int = 42) -> None:
    """Write the corpus: lines of 10 words from w0..w9999, spread over `files` files."""
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(10_000)]
    lines = [" ".join(rng.choices(vocabulary, k=10)) for _ in range(words // 10)]
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (directory / f"part-{i}.txt").write_text("\n".join(lines[i::files]) + "\n")


@contextlib.contextmanager
def prepared(words: int) -> Iterator[Path]:
    """A temporary working directory with the corpus and the user functions, made current."""
    before = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        make_corpus(workdir / "corpus", words)
        (workdir / "benchfns.py").write_text(FNS)
        os.chdir(workdir)
        try:
            yield workdir
        finally:
            os.chdir(before)


def baseline(directory: Path) -> float:
    """Seconds for a plain Python loop to count the corpus's words."""
    start = time.perf_counter()
    counts: dict[str, int] = defaultdict(int)
    for path in sorted(directory.glob("*.txt")):
        with open(path) as f:
            for line in f:
                for w in line.split():
                    counts[w] += 1
    return time.perf_counter() - start


def job(workdir: Path, name: str, parallelism: int, *, combine: bool = True) -> Path:
    """The word-count job `name` (its own job id and output) at a parallelism, pre-aggregated or not."""
    count: dict[str, object] = {"id": "count", "type": "aggregate", "aggregate": "count", "emit": "final"}
    if not combine:
        count["combine"] = False
    spec = {
        "jobId": f"bench-{name}",
        "parallelism": parallelism,
        "model": {
            "sources": [
                {"id": "lines", "type": "file", "config": {"path": str(workdir / "corpus" / "*.txt")}}
            ],
            "operators": [
                {"id": "split", "type": "flat_map", "fn": "benchfns:split"},
                {"id": "by-word", "type": "key_by", "key": {"fn": "benchfns:word"}},
                count,
            ],
            "sinks": [
                {
                    "id": "out",
                    "type": "file",
                    "parallelism": 1,
                    "config": {"path": str(workdir / f"out-{name}")},
                }
            ],
        },
    }
    path = workdir / f"job-{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run(workdir: Path, path: Path, *, in_process: bool) -> runner.RunResult:
    """Run a job through the local runner (forked task processes unless in-process)."""
    plans = compiler.compile_model(load_file(path), backend="local")
    options = runner.RunOptions(
        in_process=in_process, quiet=True, workdir=workdir / ".nopstream", python_path=(str(workdir),)
    )
    return runner.run_job(plans, options)


def files_per_subtask(workdir: Path, parallelism: int) -> list[int]:
    """How many of the corpus's files each source subtask reads (the file source's own assignment)."""
    config = {"path": str(workdir / "corpus" / "*.txt")}
    return [len(FileSource(config, subtask=i, parallelism=parallelism).cursors) for i in range(parallelism)]


def check(workdir: Path, name: str, words: int) -> None:
    """The job counted every word."""
    total = 0
    for f in (workdir / f"out-{name}").glob("*.jsonl"):
        total += sum(int(line.rsplit(":", 1)[1].rstrip("}\n")) for line in f.read_text().splitlines())
    if total != words:
        raise SystemExit(f"{name}: counted {total} words, expected {words}")


def main() -> None:
    """Measure and print the ratios."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--words", type=int, default=8_000_000)
    parser.add_argument("--parallelism", default="1,2,4,8,16", help="the process rows, comma-separated")
    args = parser.parse_args()
    rows: list[tuple[str, str, int, bool, bool]] = [("in-process, parallelism 1", "in-p1", 1, True, True)]
    for n in (int(p) for p in args.parallelism.split(",")):
        rows.append((f"processes, parallelism {n}", f"p{n}", n, False, True))
        if n == 2:
            rows.append(("processes, parallelism 2, combine: false", "p2-nc", 2, False, False))
    results = []
    with prepared(args.words) as workdir:
        base = min(baseline(workdir / "corpus") for _ in range(3))
        for title, name, parallelism, in_process, combine in rows:
            result = run(workdir, job(workdir, name, parallelism, combine=combine), in_process=in_process)
            check(workdir, name, args.words)
            results.append((title, result))
        # files go to subtasks by a hash of their path, which changes with the temporary directory
        shares = {n: files_per_subtask(workdir, n) for n in sorted({row[2] for row in rows if not row[3]})}
    words = args.words
    print(f"corpus: {words:,} words, lines of 10 from a 10,000-word vocabulary (seed 42), 16 files")
    print(f"machine: {os.cpu_count()} cores")
    print(f"{'':<42} {'processing':>24} {'whole run (with start-up)':>32}")
    print(f"{'baseline (plain Python loop)':<42} {words / base:>12,.0f} words/s  1.000")
    for name, result in results:
        p, w = result.processing_seconds, result.seconds
        figures = f"{words / p:>12,.0f} words/s  {base / p:.3f}   {words / w:>12,.0f} words/s  {base / w:.3f}"
        print(f"{name:<42} {figures}")
    print("targets: processes p2 >= 0.8, in-process p1 >= 0.5, p4 not slower than p2 (processing time)")
    print("files per source subtask in this run:", "; ".join(f"p{n} {c}" for n, c in shares.items()))


if __name__ == "__main__":
    main()
