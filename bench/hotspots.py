"""Where a word count's time goes: the in-process run of `bench/throughput.py` under cProfile.

In-process, every task runs in this one process, so one profile sees the whole
per-record path (reading, the chain, the shuffle, the combiner, the aggregate).
Prints the functions with the most time of their own.
Run: `python bench/hotspots.py [--words N] [--top N] [--no-combine]`.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput  # the bench next to this file


def main() -> None:
    """Profile one in-process run and print the top functions."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--words", type=int, default=2_000_000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--no-combine", action="store_true", help="without pre-aggregation")
    args = parser.parse_args()
    with throughput.prepared(args.words) as workdir:
        path = throughput.job(workdir, "profile", 1, combine=not args.no_combine)
        profile = cProfile.Profile()
        profile.enable()
        result = throughput.run(workdir, path, in_process=True)
        profile.disable()
    print(f"{args.words:,} words in {result.processing_seconds:.2f} s of processing (under the profiler)")
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
