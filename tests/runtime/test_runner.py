"""`nopstream run`: a failing task fails the run with its error; progress on a terminal; the example."""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import textwrap
import time

import pytest

from nopstream.local import runner
from nopstream.model.load import load_data
from nopstream.plan import compiler
from tests.conftest import ROOT, run_nopstream
from tests.runtime.conftest import read_outputs, write_job


@pytest.mark.parametrize("mode", ["processes", "in-process"])
def test_a_failing_task_fails_the_run_with_its_error(tmp_path, mode):
    fns = """
        def explode(r):
            if r == 1234:
                raise ValueError("record 1234 is cursed")
            return r
    """
    model = {
        "sources": [{"id": "src", "type": "generator", "config": {"count": 5000}}],
        "operators": [{"id": "boom", "type": "map", "inputs": ["src"], "fn": "jobfns:explode"}],
        "sinks": [{"id": "out", "type": "file", "inputs": ["boom"], "config": {"path": "out/out"}}],
    }
    write_job(tmp_path, model, fns=fns, parallelism=2)
    args = ["run", "job.yaml", "--max-restarts", "2"] + (["--in-process"] if mode == "in-process" else [])
    result = run_nopstream(*args, cwd=tmp_path)
    assert result.code == 3
    failed = next(line for line in result.err.splitlines() if line.startswith("job 'test' failed: "))
    # with task processes the cause says the error's last line, then the count of recoveries; the
    # whole error below it
    rate = "3 failures within 600 s; the limit is 2, after 2 recoveries"
    ending = f"jobfns.py:4 in explode ({rate}):" if mode == "processes" else " failed:"
    assert failed.startswith("job 'test' failed: task test/main/src/") and failed.endswith(ending), failed
    assert "ValueError: record 1234 is cursed" in result.err
    # with task processes, each failure is a global recovery until the restarts run out
    expected_recoveries = 2 if mode == "processes" else 0
    assert result.err.count("recovering: task test/main/src/") == expected_recoveries
    for line in result.err.splitlines():  # each says why in one line
        if line.startswith("recovering: "):
            assert " failed: " in line and "record 1234 is cursed" in line, line


def test_progress_line_shows_rates_per_vertex(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = {
        "jobId": "progress",
        "model": {
            "sources": [{"id": "src", "type": "generator", "config": {"count": 3000, "ratePerSecond": 1500}}],
            "sinks": [
                {
                    "id": "out",
                    "type": "file",
                    "inputs": ["src"],
                    "partitioning": "rebalance",
                    "config": {"path": "out"},
                }
            ],
        },
    }
    plans = compiler.compile_model(load_data(model), backend="local")
    shown = io.StringIO()
    runner.run_job(plans, runner.RunOptions(in_process=True, progress=shown))
    lines = [line for line in shown.getvalue().split("\r") if line.strip()]
    assert lines, "no progress line was shown"
    assert lines[0].startswith("src in ") and " | out in " in lines[0]
    quiet = io.StringIO()
    runner.run_job(plans, runner.RunOptions(in_process=True, progress=quiet, quiet=True))
    assert quiet.getvalue() == ""


def test_the_wordcount_example_runs_end_to_end(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    result = run_nopstream("run", "examples/wordcount.yaml", cwd=tmp_path)
    assert result.code == 0, result.err
    assert f"sink 'out' wrote to {tmp_path / 'out' / 'wordcount'}" in result.err
    counts = {}
    for path in (tmp_path / "out" / "wordcount").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            assert record["key"] not in counts
            counts[record["key"]] = record["value"]
    expected: dict[str, int] = {}
    for path in sorted((ROOT / "examples" / "data" / "wordcount").glob("*.txt")):
        for word in path.read_text().lower().split():
            expected[word] = expected.get(word, 0) + 1
    assert counts == expected


def test_status_lists_durable_epochs_and_the_latest_manifest(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    assert run_nopstream("run", "examples/wordcount.yaml", "--quiet", cwd=tmp_path).code == 0
    result = run_nopstream("status", ".nopstream/checkpoints", cwd=tmp_path)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("wordcount/main: durable epochs ")
    assert lines[1] == "  lineage 1: epochs from 1"
    assert lines[2].startswith("  latest: epoch ") and "(final)" in lines[2]
    # the final epoch pre-committed the sink's last transaction; it was committed after the manifest
    assert lines[3].startswith("  5 tasks, ") and ", 1 pending sink transactions, " in lines[3]
    missing = run_nopstream("status", "nowhere", cwd=tmp_path)
    assert missing.code == 1 and missing.err == (
        "nowhere: no such file or directory (give a job's file or a checkpoint directory)\n"
    )


def test_a_task_process_never_frees_what_it_inherited_from_the_runner(tmp_path, monkeypatch):
    """A forked task may free only what it made itself. A forked child that collects a Kafka
    consumer its parent left as garbage dies of SIGSEGV (librdkafka is not fork-safe:
    reproduced alone), and a CI run printed a fatal-signal dump of that shape from a process
    forked by a test worker. Here the runner's process holds garbage whose finalizer records
    the process that runs it, and the job's own function runs a full collection in the task."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "collecting.py").write_text(
        "import gc\n\ndef collect(r):\n    if r == 0:\n        gc.collect()\n    return r\n"
    )
    model = {
        "jobId": "inherited",
        "model": {
            "sources": [{"id": "src", "type": "generator", "config": {"count": 300}}],
            "operators": [{"id": "gc", "type": "map", "inputs": ["src"], "fn": "collecting:collect"}],
            "sinks": [{"id": "out", "type": "file", "inputs": ["gc"], "config": {"path": "out"}}],
        },
    }
    plans = compiler.compile_model(load_data(model), backend="local")
    options = runner.RunOptions(quiet=True, python_path=(str(tmp_path),), max_restarts=0)
    freed_in = tmp_path / "freed-in"

    class Inherited:
        def __del__(self) -> None:
            with freed_in.open("a") as f:
                f.write(f"{os.getpid()}\n")

    gc.disable()  # until the tasks are forked, the garbage below stays in this process
    try:
        garbage = Inherited()
        garbage.itself = garbage  # type: ignore[attr-defined]  # only the cyclic collector frees it
        del garbage
        runner.run_job(plans, options)
    finally:
        gc.enable()
        gc.collect()
    assert sorted(read_outputs(tmp_path / "out")) == list(range(300))
    assert freed_in.read_text().split() == [str(os.getpid())]  # here, never in a task


def test_an_outage_of_a_few_seconds_is_outlived_by_backing_off(tmp_path):
    """A 6 s PostgreSQL restart used all 10 recoveries in about 6 s and failed the job.

    Here every record fails for the first 4 s after the first run began (a dependency
    that is down), with `--max-restarts 5`: without backing off, five recoveries took
    about 3 s here and the job failed; backing off (0, 0.25, 0.5, 1, 2 s) outlives it.
    """
    fns = """
        import os, time
        def down_for_a_while(r):
            began = float(os.environ["OUTAGE_BEGAN"])
            if time.time() < began + 4:
                raise ConnectionError("the dependency is down")
            return r
    """
    model = {
        "jobId": "outage",
        "model": {
            "sources": [{"id": "src", "type": "generator", "config": {"count": 200}}],
            "operators": [{"id": "call", "type": "map", "inputs": ["src"], "fn": "jobfns:down_for_a_while"}],
            "sinks": [{"id": "out", "type": "file", "inputs": ["call"], "config": {"path": "out"}}],
        },
    }
    (tmp_path / "jobfns.py").write_text(textwrap.dedent(fns))
    (tmp_path / "job.yaml").write_text(json.dumps(model))
    env = {"OUTAGE_BEGAN": repr(__import__("time").time())}
    result = run_nopstream("run", "job.yaml", "--max-restarts", "5", cwd=tmp_path, env=env)
    assert result.code == 0, result.err
    assert sorted(read_outputs(tmp_path / "out")) == list(range(200))
    waits = [
        line.rpartition("after ")[2] for line in result.err.splitlines() if line.startswith("recovering:")
    ]
    assert 1 <= len(waits) <= 5, result.err
    assert waits[1:] == ["0.25 s)", "0.5 s)", "1 s)", "2 s)"][: len(waits) - 1], result.err


def test_a_source_pauses_after_each_batch_when_asked(tmp_path):
    """What `nopstream chaos --pace` sets: 1,000 records in batches of 100, 150 ms after each."""
    model = {
        "sources": [{"id": "src", "type": "generator", "config": {"count": 1000}}],
        "sinks": [{"id": "out", "type": "file", "inputs": ["src"], "config": {"path": "out"}}],
    }
    write_job(tmp_path, model)
    paced = {"NOPSTREAM_SOURCE_PAUSE_MS": "150", "NOPSTREAM_BATCH_SIZE": "100"}
    started = time.monotonic()
    result = run_nopstream("run", "job.yaml", "--in-process", "--quiet", env=paced, cwd=tmp_path)
    assert result.code == 0, result.err
    assert time.monotonic() - started >= 1.4  # ten batches, each followed by its pause
    assert sorted(read_outputs(tmp_path / "out")) == list(range(1000))
