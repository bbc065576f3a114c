"""What a job's processes cost to start, as ratios measured in one run.

The word count example (`examples/wordcount.yaml`), run to its end by the command line
as a user runs it, each turn on a fresh copy of the example; a row's figure is the CPU
the command spent with every process it started (their user and system time, as the
kernel sums them for a waited-for child), and its wall time. Rows and the ratio to the
first:
  run          `nopstream run` (the embedded default: task processes forked from it)
  run --etcd   `nopstream run --etcd` on a real etcd (`e2e.servers`): two coordinator
               candidates and one process per task, forked ready-loaded by its zygote
               (`local/zygote.py`), each with its own lease and TLS as on a cluster
Each row runs `--repeat` times, taking turns; a row's figure is its median, with its
lowest and highest ratio. Every run must exit 0 and write the same word counts.
Run: `python bench/starts.py [--repeat 5]`.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e import servers  # noqa: E402


def one_run(workdir: Path, extra: list[str]) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, the sorted output) of one run of the word count in a fresh copy."""
    shutil.copytree(ROOT / "examples", workdir / "examples")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "nopstream", "run", "examples/wordcount.yaml", "--quiet", *extra],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"nopstream run {' '.join(extra)} exited {result.returncode}:\n{result.stderr}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    lines = sorted(line for path in (workdir / "out").rglob("*") if path.is_file() for line in path.open())
    return cpu, wall, "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nopstream-bench-") as tmp:
        home = Path(tmp)
        etcd = servers.start_etcd(home)
        try:
            host, port = etcd.endpoint
            rows = {"run": [], "run --etcd": ["--etcd", f"{host}:{port}"]}
            figures: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
            outputs = set()
            for turn in range(args.repeat):
                for name, extra in rows.items():
                    cpu, wall, output = one_run(home / f"{turn}-{name.replace(' ', '')}", extra)
                    figures[name].append((cpu, wall))
                    outputs.add(output)
            if len(outputs) != 1:
                raise SystemExit("the runs wrote different word counts")
        finally:
            etcd.stop()
    base_cpu = statistics.median(cpu for cpu, _ in figures["run"])
    base_wall = statistics.median(wall for _, wall in figures["run"])
    print(f"word count example, {args.repeat} turns; median (lowest-highest ratio to `run`)")
    for name, turns in figures.items():
        cpus, walls = [c for c, _ in turns], [w for _, w in turns]
        print(
            f"  {name:<11} CPU {statistics.median(cpus):5.2f} s = {statistics.median(cpus) / base_cpu:4.2f}"
            f" ({min(cpus) / base_cpu:.2f}-{max(cpus) / base_cpu:.2f})"
            f"   wall {statistics.median(walls):5.2f} s = {statistics.median(walls) / base_wall:4.2f}"
            f" ({min(walls) / base_wall:.2f}-{max(walls) / base_wall:.2f})"
        )


if __name__ == "__main__":
    main()
