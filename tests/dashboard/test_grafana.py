"""Every metric the Grafana dashboard and the alerts of the chart name is one a running job serves.

A real `nopstream run` (task processes, a HASH edge, a file sink) is scraped while it
runs: its control server's /metrics (the coordinator's families) and every task's.
Each query of `charts/nopstream/files/grafana-dashboard.json` and each rule of
`files/alerts.yaml` is read for the nopstream metric names it uses; every one must be
among the scraped samples (a renamed metric or a typo fails here, not on a blank panel).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from nopstream.model.load import load_file
from nopstream.node.wire import guard
from nopstream.plan import compiler
from tests.conftest import ROOT

CHART_FILES = ROOT / "charts" / "nopstream" / "files"
METRIC = re.compile(r"\bnopstream_[a-z0-9_]+\b")


def model() -> dict:
    return {
        "jobId": "scraped",
        "parallelism": 2,
        "checkpoint": {"intervalMs": 300, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [
                {
                    "id": "numbers",
                    "type": "generator",
                    "config": {"kind": "events", "keys": 50, "count": 200_000, "ratePerSecond": 20_000},
                }
            ],
            "operators": [
                {"id": "by-value", "type": "key_by", "key": {"field": "key"}},
                {"id": "sum", "type": "aggregate", "aggregate": "count", "emit": "rolling"},
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }


def scrape(url: str, secret: str | None = None) -> set[str]:
    """The sample names of one /metrics page (counters with their _total)."""
    request = urllib.request.Request(url, headers=guard.headers(secret) if secret else {})
    with urllib.request.urlopen(request, timeout=10) as r:
        text = r.read().decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def queries() -> list[str]:
    """Every PromQL expression the chart ships: the dashboard's targets and the alerts' rules."""
    dashboard = json.loads((CHART_FILES / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    rules = yaml.safe_load((CHART_FILES / "alerts.yaml").read_text())
    exprs += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    return exprs


def test_every_metric_the_dashboard_and_the_alerts_query_is_served(tmp_path):
    home = tmp_path / "job"
    home.mkdir()
    (home / "job.yaml").write_text(yaml.safe_dump(model(), sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    job = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", "--quiet"],
        cwd=home,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_dir = home / ".nopstream" / "runs" / "scraped" / "run-1"
        deadline = time.monotonic() + 30
        while not (run_dir / "secret").exists() or not list((home / "cp").rglob("_manifest.json")):
            assert time.monotonic() < deadline and job.poll() is None, "the job never made a durable epoch"
            time.sleep(0.05)
        control, secret = (run_dir / "control-url").read_text(), (run_dir / "secret").read_text()
        names = scrape(f"{control}/metrics")
        plan = compiler.compile_model(load_file(home / "job.yaml")).partitioned
        for task_id in plan.task_ids():
            request = urllib.request.Request(
                f"{control}/endpoint?task={task_id}", headers=guard.headers(secret)
            )
            with urllib.request.urlopen(request, timeout=10) as r:
                names |= scrape(json.loads(r.read())["endpoint"] + "/metrics")
    finally:
        job.kill()
        job.wait()
    used = {name for expr in queries() for name in METRIC.findall(expr)}
    assert len(used) >= 15, sorted(used)
    assert used - names == set(), f"queried but not served: {sorted(used - names)}"
    # and the alerts the issue asks for are there, by what they watch
    alerts = " ".join(queries()[-5:])
    for watched in (
        "nopstream_latest_durable_timestamp_seconds",
        "nopstream_aborted_epochs_total",
        "nopstream_recoveries_total",
        "nopstream_task_refused_commands_total",
    ):
        assert watched in alerts, watched


def test_the_dashboard_is_grafana_json_with_a_datasource_variable():
    dashboard = json.loads((CHART_FILES / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] == "nopstream-jobs"
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
    assert Path(CHART_FILES / "alerts.yaml").read_text().count("alert: ") == 5
