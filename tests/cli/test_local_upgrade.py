"""A local job rescaled and upgraded: `nopstream savepoint --stop`, then `nopstream run` of the changed job.

The change is classified by the operator's rules from the plan the savepoint was taken
with (kept beside the epochs): a rescale 2 -> 3 -> 1 of a rolling count gives exactly
every count of every key once; a refused change and a changed job whose latest epoch is
no stop savepoint are refused with the reasons, nothing written.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

from nopstream.connectors import files
from tests.conftest import ROOT, after_dashboard_line, run_nopstream

KEYS, COUNT = 40, 6000


def write_job(tmp_path: Path, *, parallelism: int, shards: int = 64, rate: int = 600) -> None:
    """A rolling count per key of generated events (4 splits, whatever the parallelism)."""
    job = {
        "apiVersion": "nopstream.io/v1alpha1",
        "kind": "StreamJob",
        "metadata": {"name": "rescaled"},
        "spec": {
            "parallelism": parallelism,
            "stateShardCount": shards,
            "checkpoint": {"intervalMs": 200},
            "model": {
                "sources": [
                    {
                        "id": "events",
                        "type": "generator",
                        "config": {
                            "kind": "events",
                            "count": COUNT,
                            "keys": KEYS,
                            "splits": 4,
                            "ratePerSecond": rate,
                        },
                    }
                ],
                "operators": [
                    {"id": "by-key", "type": "key_by", "inputs": ["events"], "key": {"field": "key"}},
                    {
                        "id": "count",
                        "type": "aggregate",
                        "inputs": ["by-key"],
                        "aggregate": "count",
                        "emit": "rolling",
                    },
                ],
                "sinks": [{"id": "out", "type": "file", "inputs": ["count"], "config": {"path": "out"}}],
            },
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))


def start(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    """`nopstream run job.yaml` in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", *options],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def latest_epoch(tmp_path: Path) -> int:
    """The newest durable epoch in the job's checkpoints (0: none)."""
    # a fixed depth: retention deletes older epochs' directories while this reads
    found = (tmp_path / ".nopstream/checkpoints/checkpoint/rescaled/main").glob("*/_manifest.json")
    return max((int(p.parent.name) for p in found), default=0)


def after_a_new_epoch(tmp_path: Path) -> None:
    """Wait until the running job makes a second epoch durable."""
    before = latest_epoch(tmp_path)
    deadline = time.monotonic() + 30
    while latest_epoch(tmp_path) <= before + 1:
        assert time.monotonic() < deadline, "no new durable epoch in 30 s"
        time.sleep(0.05)


def stop_after_an_epoch(tmp_path: Path, proc: subprocess.Popen[str]) -> str:
    """Once the run has a new durable epoch, `nopstream savepoint --stop`; the run's stderr."""
    after_a_new_epoch(tmp_path)
    asked = run_nopstream("savepoint", "job.yaml", "--stop", cwd=tmp_path)
    assert asked.code == 0, asked.err
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def outputs(tmp_path: Path) -> Counter[tuple[str, int]]:
    return Counter((r["key"], r["value"]) for r in files.committed_records({"path": str(tmp_path / "out")}))


EXPECTED = Counter((f"k{k}", n) for k in range(KEYS) for n in range(1, COUNT // KEYS + 1))


def test_a_rolling_count_rescaled_2_3_1_from_stop_savepoints_is_exact(tmp_path):
    write_job(tmp_path, parallelism=2)
    first = stop_after_an_epoch(tmp_path, start(tmp_path, "--quiet"))
    assert first.startswith("job 'rescaled' stopped at savepoint epoch "), first
    stopped = int(first.split("epoch ")[1].split(",")[0])
    assert 0 < len(outputs(tmp_path)) < len(EXPECTED)  # stopped part way, its output committed
    write_job(tmp_path, parallelism=3)
    second = after_dashboard_line(stop_after_an_epoch(tmp_path, start(tmp_path)))
    assert second.startswith(
        f"job 'rescaled': RESCALE from savepoint epoch {stopped}: RESCALE [rescale] source 'events'"
        " (generator) parallelism 2 -> 3: splits are reassigned from the restored enumerator state;"
    ), second
    assert "stopped at savepoint epoch" in second
    assert len(outputs(tmp_path)) < len(EXPECTED), "the second run ended before its stop: give it more input"
    write_job(tmp_path, parallelism=1)
    third = run_nopstream("run", "job.yaml", cwd=tmp_path)
    assert third.code == 0, third.err
    assert after_dashboard_line(third.err).startswith("job 'rescaled': RESCALE from savepoint epoch ")
    assert "source 'events' (generator) parallelism 3 -> 1" in third.err
    assert outputs(tmp_path) == EXPECTED


def test_a_refused_change_and_a_change_without_a_stop_savepoint_are_refused_untouched(tmp_path):
    write_job(tmp_path, parallelism=2)
    stopped = stop_after_an_epoch(tmp_path, start(tmp_path)).split("epoch ")[1].split(",")[0]
    write_job(tmp_path, parallelism=2, shards=128)
    kept = sorted(p for p in tmp_path.rglob("*") if p.is_file() and "runs" not in p.parts)
    refused = run_nopstream("run", "job.yaml", "--quiet", cwd=tmp_path)
    assert refused.code == 1
    fingerprint = refused.err.split("(plan ")[1][:19]
    assert refused.err == (
        f"job 'rescaled' cannot restore: the change from savepoint epoch {stopped} (plan"
        f" {fingerprint}) is refused: REFUSED [state-shard-count] stateShardCount is fixed for the job's"
        " lifetime: 64 -> 128\n"
    )
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file() and "runs" not in p.parts) == kept
    # the same job again, stopped by SIGTERM instead: its latest epoch is no stop savepoint
    write_job(tmp_path, parallelism=2)
    proc = start(tmp_path, "--quiet")
    after_a_new_epoch(tmp_path)
    proc.terminate()
    proc.communicate(timeout=30)
    write_job(tmp_path, parallelism=3)
    refused = run_nopstream("run", "job.yaml", "--quiet", cwd=tmp_path)
    assert refused.code == 1
    assert refused.err.startswith("job 'rescaled' cannot restore: epoch "), refused.err
    assert refused.err.endswith(
        ": a changed job starts from a stop savepoint (run the version that took the epoch, `nopstream"
        " savepoint --stop FILE` while it runs, then run the changed one; or start over with --fresh)\n"
    )
