"""Compile a 200-operator model at parallelism 64; print the time per compile and the plan size.

Target (issue "plan compiler"): under one second per compile on these machines.
Every tenth operator is keyed behind a key_by, so the plan holds HASH edges with
64 x 64 channels each; the rest are stateless and chain. Run: `make bench` or
`python bench/compile.py [--operators N] [--parallelism P] [--repeat R]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from nopstream.model.load import load_data
from nopstream.plan import compiler


def big_model(operators: int, parallelism: int) -> dict[str, Any]:
    """A linear model with `operators` operators; every 10th is a key_by + aggregate pair."""
    ops: list[dict[str, Any]] = []
    while len(ops) < operators:
        i = len(ops)
        if i % 10 == 8 and len(ops) + 2 <= operators:
            ops.append({"id": f"key-{i}", "type": "key_by", "key": {"field": "k"}})
            ops.append({"id": f"agg-{i}", "type": "aggregate", "aggregate": "sum"})
        else:
            kind = ("map", "filter", "flat_map")[i % 3]
            ops.append({"id": f"op-{i}", "type": kind, "fn": "bench:f"})
    return {
        "jobId": "bench",
        "parallelism": parallelism,
        "model": {
            "sources": [{"id": "src", "type": "generator", "config": {"count": 1}}],
            "operators": ops,
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }


def main() -> None:
    """Compile repeatedly and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--operators", type=int, default=200)
    parser.add_argument("--parallelism", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    data = big_model(args.operators, args.parallelism)
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        plans = compiler.compile_model(load_data(data))
        document = compiler.dump_document(plans.partitioned)  # includes the fingerprint
        times.append(time.perf_counter() - start)
    plan = plans.partitioned
    channels = sum(len(e.channels) for e in plan.edges)
    best, median = min(times), statistics.median(times)
    print(f"model: {args.operators} operators, parallelism {args.parallelism}")
    print(
        f"plan: {len(plan.vertices)} vertices, {len(plan.ack_set)} tasks, {len(plan.edges)} edges,"
        f" {channels} channels, {len(document) / 1e6:.2f} MB as a plan document"
    )
    print(
        f"compile (validate + 4 layers + document + fingerprint): best {best:.3f} s, median {median:.3f} s"
        f" over {args.repeat}"
    )
    print(f"target < 1 s: {'met' if median < 1.0 else 'NOT met'} (median / target = {median:.2f})")


if __name__ == "__main__":
    main()
