"""The command line turns the garbage collector off while a command loads, and on again for the job.

`nopstream.cli.startup`: a process that left it off would never collect its cyclic garbage,
so each job function below reports, from inside the task process that runs it, whether its
collector is on and whether the loaded modules were frozen out of its collections.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_nopstream

FNS = """
import gc


def probe(record):
    return {"n": record, "collecting": gc.isenabled(), "frozen": gc.get_freeze_count() > 0}
"""


@pytest.mark.parametrize("mode", ["run", "etcd"])
def test_every_task_process_of_a_run_collects_its_garbage_with_the_loaded_modules_frozen(
    mode, tmp_path, etcd_server
):
    home = tmp_path / "job"
    home.mkdir()
    (home / "gcfns.py").write_text(FNS)
    job = {
        "jobId": f"startup-{mode}",
        "parallelism": 2,
        "model": {
            "sources": [{"id": "numbers", "type": "generator", "config": {"count": 40}}],
            "operators": [{"id": "probe", "type": "map", "fn": "gcfns:probe"}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    (home / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    etcd = ["--etcd", "{}:{}".format(*etcd_server.endpoint)] if mode == "etcd" else []
    result = run_nopstream("run", "job.yaml", *etcd, cwd=home)
    assert result.code == 0, result.err
    records = [
        json.loads(line)
        for path in Path(home, "out").rglob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert sorted(r["n"] for r in records) == list(range(40))
    assert {(r["collecting"], r["frozen"]) for r in records} == {(True, True)}, records
