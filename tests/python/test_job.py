"""Jobs written, run, proved and exported from Python (`nopstream.Job`, `nopstream.testing`).

Every output is compared with what the test computes itself; every refusal with its exact line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import yaml

from nopstream import CannotStart, Job, ModelError, RunFailed, testing
from nopstream.model.load import load_file
from nopstream.plan import compiler
from nopstream.plan.canonical import fingerprint
from tests.conftest import ROOT, run_nopstream
from tests.python import jobfns

LINES = ["a b c", "b c", "c", "d a"]
COUNTS = Counter({"a": 2, "b": 2, "c": 3, "d": 1})


def wordcount(tmp_path: Path, sink: str | None = None) -> tuple[Job, testing.Collected | None]:
    """The word count over LINES, checkpointed under `tmp_path`; collected, or into the file sink `sink`."""
    job = Job("wc", parallelism=2, checkpoint={"storage": {"local": {"path": str(tmp_path / "cp")}}})
    lines = testing.source(job, "lines", LINES, splits=2)
    words = lines.flat_map(jobfns.split, id="split").key_by(fn=jobfns.word, id="by-word")
    counts = words.aggregate("count", id="count", emit="final")
    if sink is not None:
        counts.sink("out", "file", config={"path": sink})
        return job, None
    return job, testing.collect(counts, "out", path=tmp_path / "out")


def counted(records: list) -> Counter:
    return Counter({r["key"]: r["value"] for r in records})


@pytest.mark.parametrize("in_process", [False, True], ids=["processes", "in-process"])
def test_a_job_runs_from_python_and_a_second_run_finds_it_finished(tmp_path, in_process):
    job, out = wordcount(tmp_path)
    assert out is not None
    done = job.run(in_process=in_process, workdir=tmp_path / "work")
    assert counted(out.records) == COUNTS and len(out.records) == len(COUNTS)
    assert done.output("out") == out.records
    assert (done.job_id, done.runs, done.resumed_from, done.already_finished) == ("wc", 1, None, False)
    assert done.epochs and done.last_epoch == done.epochs[-1]
    assert done.records_in["lines"] == len(LINES)
    again = job.run(in_process=in_process, workdir=tmp_path / "work")
    assert (again.already_finished, again.resumed_from) == (True, done.last_epoch)
    assert counted(out.records) == COUNTS and len(out.records) == len(COUNTS)  # nothing emitted again
    with pytest.raises(KeyError, match=r"^\"job 'wc' has no sink 'nope' \(its sinks: out\)\"$"):
        done.output("nope")


def test_to_yaml_is_the_same_job_for_the_command_and_plan_prints_what_the_command_prints(tmp_path):
    here, there = tmp_path / "python", tmp_path / "cli"
    here.mkdir()
    there.mkdir()
    job, _ = wordcount(tmp_path, sink="out")
    text = job.to_yaml()
    manifest = yaml.safe_load(text)
    assert (manifest["apiVersion"], manifest["kind"], manifest["metadata"]) == (
        "nopstream.io/v1alpha1",
        "StreamJob",
        {"name": "wc"},
    )
    (there / "job.yaml").write_text(text)
    from_yaml = compiler.compile_model(load_file(there / "job.yaml")).partitioned
    assert fingerprint(from_yaml) == fingerprint(compiler.compile_model(job._loaded()).partitioned)
    printed = run_nopstream("plan", "job.yaml", cwd=there)
    assert printed.code == 0 and printed.out == job.plan() + "\n"
    os.chdir(here)
    try:
        done = job.run()
    finally:
        os.chdir(ROOT)
    assert counted(done.output("out")) == COUNTS  # relative to where it ran: python/out
    (tmp_path / "cp").rename(tmp_path / "cp-python")  # the command starts from nothing too
    ran = run_nopstream("run", "job.yaml", "--quiet", cwd=there)
    assert ran.code == 0, ran.err
    from nopstream.connectors.files import committed_records

    assert Counter(map(str, committed_records({"path": str(there / "out")}))) == Counter(
        map(str, committed_records({"path": str(here / "out")}))
    )


def test_a_run_that_cannot_start_or_fails_raises_its_typed_error_with_the_commands_line(tmp_path):
    job = Job("nothing", checkpoint={"storage": {"local": {"path": str(tmp_path / "cp")}}})
    job.source("lines", "file", config={"path": str(tmp_path / "none/*.txt")}).sink(
        "out", "file", config={"path": str(tmp_path / "out")}
    )
    with pytest.raises(CannotStart) as cannot:
        job.run(workdir=tmp_path / "work")
    assert str(cannot.value) == (
        "job 'nothing' cannot start:\n"
        f"  model.sources[0].config.path: '{tmp_path}/none/*.txt' matches no file (a source that should wait"
        " for files sets discoveryIntervalMs) (rule: readable)"
    )
    assert cannot.value.exit_code == 3
    failing = Job("seven", checkpoint={"storage": {"local": {"path": str(tmp_path / "cp")}}})
    numbers = testing.source(failing, "numbers", list(range(10)))
    testing.collect(numbers.map(jobfns.refuse_seven, id="refuse"), "out", path=tmp_path / "seven")
    with pytest.raises(RunFailed) as failed:
        failing.run(in_process=True, workdir=tmp_path / "work", max_restarts=0)
    assert str(failed.value) == (
        "job 'seven' failed: task seven/main/numbers/0 failed:\noperator 'refuse' (map) failed: ValueError:"
        f" seven is not taken at {jobfns.__file__}:22 in refuse_seven"
    )
    invalid = Job("invalid")
    testing.source(invalid, "numbers", [1]).aggregate("count", id="count").sink("out", "stdout")
    with pytest.raises(ModelError, match=r"keyed"):
        invalid.run()


SCRIPT = """
    import sys
    from nopstream import Job, NotImportable, testing


    def double(record):
        return record * 2


    job = Job("script", checkpoint={"storage": {"local": {"path": sys.argv[1] + "/cp"}}})
    out = testing.collect(testing.source(job, "n", [1, 2, 3]).map(double, id="double"), "out",
                          path=sys.argv[1] + "/out")
    job.run(workdir=sys.argv[1] + "/work")
    print(sorted(out.records))
    for leaving in (job.to_yaml, job.chaos):
        try:
            leaving()
        except NotImportable as refused:
            print(refused)
"""


def test_functions_of_the_script_being_run_run_locally_and_are_refused_where_they_would_leave(tmp_path):
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    ran = subprocess.run(
        [sys.executable, "script.py", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    refusal = (
        "model.operators[0].fn: 'double' is defined in the script being run (__main__), which other"
        " processes cannot import: put it in a module beside the script and import it from there"
    )
    assert (ran.returncode, ran.stdout) == (0, f"[2, 4, 6]\n{refusal}\n{refusal}\n"), ran.stderr


def test_a_job_proves_itself_exactly_once_from_python_under_kills(tmp_path):
    job = Job("proved", parallelism=2, checkpoint={"intervalMs": 200})
    events = [{"key": f"k{i % 7}", "n": i} for i in range(6000)]
    counts = testing.source(job, "events", events, splits=3).key_by(fn=jobfns.key, id="by-key")
    testing.collect(counts.aggregate("count", id="count", emit="rolling"), "out", path=tmp_path / "unused")
    # a unit test's budget: a few kills, all reaching state; every step is `nopstream chaos`'s own tests'
    report = job.chaos(kills=3, seed=3, pace_ms=150, allow_shallow=True, workdir=tmp_path / "chaos")
    assert report.exact, report.text
    assert "verdict: exactly once" in report.text and "committed records: 6000 failure-free" in report.text
    restored = re.search(r"(\d+) task starts, (\d+) from a durable epoch", report.text)
    assert restored is not None and int(restored[2]) > 0, report.text
