"""Word-count throughput: nopstream against a plain Python loop, as ratios measured in one run.

Corpus: lines of 10 words from a 10,000-word vocabulary (fixed seed), 4 million words
by default, in 16 files. "processing" is the time from the moment every task is up
to the end; "whole run" adds starting the tasks (forking them, connecting channels).
Figures, each as words per second and as a ratio to the baseline measured in the
same run:
  baseline     a single-process Python loop counting words with a dict
  in-process   `nopstream run --in-process`, parallelism 1
  processes    `nopstream run` (one process per task), parallelism 2
Targets (issue "runtime"): in-process p1 >= 0.25, processes p2 >= 0.25 (goal 0.35).
Run: `python bench/throughput.py [--words N]`.
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


def job(workdir: Path, parallelism: int) -> Path:
    """The word-count job over the corpus, at a parallelism."""
    spec = {
        "jobId": f"bench-p{parallelism}",
        "parallelism": parallelism,
        "model": {
            "sources": [
                {"id": "lines", "type": "file", "config": {"path": str(workdir / "corpus" / "*.txt")}}
            ],
            "operators": [
                {"id": "split", "type": "flat_map", "fn": "benchfns:split"},
                {"id": "by-word", "type": "key_by", "key": {"fn": "benchfns:word"}},
                {"id": "count", "type": "aggregate", "aggregate": "count", "emit": "final"},
            ],
            "sinks": [
                {
                    "id": "out",
                    "type": "file",
                    "parallelism": 1,
                    "config": {"path": str(workdir / f"out-p{parallelism}")},
                }
            ],
        },
    }
    path = workdir / f"job-p{parallelism}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run(workdir: Path, path: Path, *, in_process: bool) -> runner.RunResult:
    """Run a job through the local runner (forked task processes unless in-process)."""
    plans = compiler.compile_model(load_file(path), backend="local")
    options = runner.RunOptions(
        in_process=in_process, quiet=True, workdir=workdir / ".nopstream", python_path=(str(workdir),)
    )
    return runner.run_job(plans, options)


def check(workdir: Path, parallelism: int, words: int) -> None:
    """The job counted every word."""
    total = 0
    for f in (workdir / f"out-p{parallelism}").glob("*.jsonl"):
        total += sum(int(line.rsplit(":", 1)[1].rstrip("}\n")) for line in f.read_text().splitlines())
    if total != words:
        raise SystemExit(f"parallelism {parallelism}: counted {total} words, expected {words}")


def main() -> None:
    """Measure and print the ratios."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--words", type=int, default=4_000_000)
    args = parser.parse_args()
    with prepared(args.words) as workdir:
        base = min(baseline(workdir / "corpus") for _ in range(3))
        in_process = run(workdir, job(workdir, 1), in_process=True)
        check(workdir, 1, args.words)
        processes = run(workdir, job(workdir, 2), in_process=False)
        check(workdir, 2, args.words)
    words = args.words
    print(f"corpus: {words:,} words, lines of 10 from a 10,000-word vocabulary (seed 42), 16 files")
    print(f"{'':<30} {'processing':>24} {'whole run (with start-up)':>32}")
    print(f"{'baseline (plain Python loop)':<30} {words / base:>12,.0f} words/s  1.000")
    for name, result in (("in-process, parallelism 1", in_process), ("processes, parallelism 2", processes)):
        p, w = result.processing_seconds, result.seconds
        figures = f"{words / p:>12,.0f} words/s  {base / p:.3f}   {words / w:>12,.0f} words/s  {base / w:.3f}"
        print(f"{name:<30} {figures}")
    print("targets: in-process p1 >= 0.25, processes p2 >= 0.25 (goal 0.35), as ratios of processing time")


if __name__ == "__main__":
    main()
