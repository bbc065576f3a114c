"""Prometheus metrics of task processes and of the coordinator, scraped during a real run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request

import yaml

from tests.conftest import ROOT, run_nopstream


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_during_a_run(tmp_path):
    spec = {
        "jobId": "metered",
        "parallelism": 2,
        "checkpoint": {"intervalMs": 200, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [
                {
                    "id": "gen",
                    "type": "generator",
                    "config": {"kind": "events", "count": 6000, "ratePerSecond": 2000},
                }
            ],
            "operators": [
                {"id": "count", "type": "aggregate", "key": {"field": "key"}, "aggregate": "count"}
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", "--quiet"], cwd=tmp_path, env=env
    )
    try:
        run_dir = tmp_path / ".nopstream" / "runs" / "metered" / "run-1"
        deadline = time.monotonic() + 60
        coordinator: dict[str, float] = {}
        while time.monotonic() < deadline:
            if (run_dir / "control-url").exists():
                coordinator = scrape((run_dir / "control-url").read_text())
                if coordinator.get("nopstream_latest_durable_epoch", 0) >= 2:
                    break
            time.sleep(0.1)
        assert coordinator["nopstream_latest_durable_epoch"] >= 2
        assert (
            coordinator["nopstream_latest_triggered_epoch"] >= coordinator["nopstream_latest_durable_epoch"]
        )
        assert coordinator["nopstream_recoveries_total"] == 0
        log = (run_dir / "logs" / "metered_main_count_0.log").read_text()
        endpoint = re.search(r"serves (http://[0-9.:]+)", log).group(1)
        task = scrape(endpoint)
        label = '{task="metered/main/count/0"}'
        assert task[f"nopstream_task_records_in_total{label}"] > 0
        assert task[f"nopstream_task_barriers_total{label}"] >= 1
        assert task[f"nopstream_task_snapshot_bytes{label}"] > 0
        assert task[f"nopstream_task_fenced_attempts_total{label}"] == 0
        assert task['nopstream_job_info{semantic_mode="STRICT_EXACTLY_ONCE"}'] == 1.0
    finally:
        assert proc.wait(120) == 0


def test_a_requested_savepoint_survives_retention(tmp_path):
    spec = {
        "jobId": "saved",
        "checkpoint": {"intervalMs": 150, "retainLatest": 1, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [
                {"id": "gen", "type": "generator", "config": {"count": 6000, "ratePerSecond": 1000}}
            ],  # 6 s: the request comes well before the end
            "sinks": [{"id": "out", "type": "file", "inputs": ["gen"], "config": {"path": "out"}}],
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", "--quiet"], cwd=tmp_path, env=env
    )
    url_file = tmp_path / ".nopstream" / "runs" / "saved" / "run-1" / "control-url"
    deadline = time.monotonic() + 30
    while not url_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    asked = run_nopstream("savepoint", "job.yaml", cwd=tmp_path)
    assert (asked.code, asked.out) == (
        0,
        "savepoint requested: the next epoch of job 'saved' is a savepoint (savepoints so far: none yet)\n",
    )
    assert proc.wait(120) == 0
    gone = run_nopstream("savepoint", "job.yaml", "--workdir", "elsewhere", cwd=tmp_path)
    assert (gone.code, gone.err) == (1, "job 'saved' is not running (no coordinator found)\n")
    manifests = sorted(
        (tmp_path / "cp" / "checkpoint" / "saved" / "main").glob("*/_manifest.json"),
        key=lambda p: int(p.parent.name),
    )
    import json

    kinds = [json.loads(m.read_text())["kind"] for m in manifests]
    # retention kept one checkpoint (the final epoch) and the savepoint, nothing else
    assert kinds == ["savepoint", "final"]
