"""Fault points: a process killed at each named dangerous moment; exact output anyway.

Each job first runs without faults, then again in a fresh directory with one fault
point armed (`nopstream/faults.py`). The committed output of the faulty run must equal
the failure-free output as a multiset: nothing lost, nothing doubled. SIGKILLs at
random moments, of tasks, coordinators and whole runners, are `nopstream chaos`'s,
run over a matrix of job shapes in `tests/chaos/`. The helpers here also serve the
etcd job tests (`tests/leases/test_job.py`).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import yaml

from tests.conftest import ROOT

FNS = """
import time

def split(line):
    time.sleep(0.0002)
    return line.split()

def word(w):
    return w

def slow(r):
    time.sleep(0.0004)
    return r
"""


def prepare(workdir: Path, model: dict, inputs: dict[str, str]) -> None:
    workdir.mkdir(parents=True)
    for name, text in inputs.items():
        (workdir / "in").mkdir(exist_ok=True)
        (workdir / "in" / name).write_text(text)
    (workdir / "faultfns.py").write_text(textwrap.dedent(FNS))
    (workdir / "job.yaml").write_text(yaml.safe_dump(model, sort_keys=False))


def _job_env(workdir: Path, env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT), str(workdir)])}


def run_job(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`nopstream run job.yaml ARGS` in `workdir`, its directory on PYTHONPATH, with extra `env`."""
    return subprocess.run(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", *args],
        cwd=workdir,
        env=_job_env(workdir, env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def start_job(workdir: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`run_job` started, not waited for: its stderr a pipe of text, its stdout dropped."""
    return subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml"],
        cwd=workdir,
        env=_job_env(workdir, env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(workdir: Path) -> tuple[int, str]:
    """Run the job failure-free; (exit code, stderr)."""
    proc = run_job(workdir)
    return proc.returncode, proc.stderr


def wordcount_model(job_id: str, *, interval_ms: int) -> dict:
    """A rolling word count over in/*.txt at parallelism 2, checkpoints in cp/, output in out/."""
    return {
        "jobId": job_id,
        "parallelism": 2,
        "checkpoint": {"intervalMs": interval_ms, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [{"id": "lines", "type": "file", "config": {"path": "in/*.txt"}}],
            "operators": [
                {"id": "split", "type": "flat_map", "fn": "faultfns:split"},
                {"id": "by-word", "type": "key_by", "key": {"fn": "faultfns:word"}},
                {"id": "count", "type": "aggregate", "aggregate": "count"},
            ],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }


def committed(workdir: Path, sink_dir: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for f in (workdir / sink_dir).glob("*.jsonl"):
        out.update(json.dumps(json.loads(line), sort_keys=True) for line in f.read_text().splitlines())
    return out


def run_with_fault(workdir: Path, point: str) -> tuple[list[int], str]:
    """Run the job with one fault point armed; when the whole command dies, start it again
    without the fault. Returns the exit code of each start and their stderr."""
    env = {"NOPSTREAM_FAULTS": point}
    codes, err = [], ""
    for _ in range(2):
        proc = run_job(workdir, "--max-restarts", "5", env=env)
        codes.append(proc.returncode)
        err += proc.stderr
        if proc.returncode == 0:
            break
        env = {}
    return codes, err


def test_faults_at_the_named_dangerous_moments(tmp_path, capsys):
    rng = random.Random(4)
    words = [f"w{i}" for i in range(100)]
    inputs = {
        # long enough for a third manifest before the final one, however fast the machine runs it
        f"part-{f}.txt": "".join(" ".join(rng.choices(words, k=6)) + "\n" for _ in range(5000))
        for f in range(4)
    }
    model = wordcount_model("named-faults", interval_ms=150)
    prepare(tmp_path / "clean", model, inputs)
    code, err = run(tmp_path / "clean")
    assert code == 0, err
    expected = committed(tmp_path / "clean", "out")
    points = {
        "before-manifest@1": "a task dies before the first durable epoch (ACKs in, no manifest yet)",
        "during-alignment@3": "a task dies while aligning a barrier",
        "before-manifest@3": "a task dies after the segments are written, before the manifest",
        "after-durable@2": "a task dies after DURABLE, before COMMITTED",
        "mid-commit@1": "a sink dies in the middle of a commit (published, not yet recorded)",
        "coordinator-before-manifest@2": "the whole command dies before a manifest, and is started again",
    }
    for point, what in points.items():
        workdir = tmp_path / point.replace("@", "-")
        prepare(workdir, model, inputs)
        codes, err = run_with_fault(workdir, point)
        with capsys.disabled():
            print(f"\n[faults] {point}: {what}; exit codes {codes}, recoveries {err.count('recovering: ')}")
        if point.startswith("coordinator-"):
            assert codes == [-9, 0], err  # killed by its own fault point, then resumed
        else:
            assert codes == [0], err
            assert err.count("recovering: ") >= 1, f"{point} never fired"
        got = committed(workdir, "out")
        assert got == expected, (
            f"{point}: lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
        )


def test_every_fault_point_is_named_in_the_catalog_and_armed_once_for_a_whole_run(tmp_path, monkeypatch):
    """`faults.POINTS` names every point the code passes (chaos arms what the failure-free run
    passed); a point armed in a directory fires in the first process to pass it, and only there."""
    import re as regex

    from nopstream import faults

    passed = {
        point
        for path in (ROOT / "nopstream").rglob("*.py")
        for point in regex.findall(r'faults\.reached\("([a-z-]+)"', path.read_text())
    }
    assert passed == set(faults.POINTS)
    monkeypatch.setenv(faults.DIR_ENV, str(tmp_path))
    fired: list[str] = []
    faults.arm(tmp_path, "mid-commit")
    faults.reached("after-stage", lambda: fired.append("after-stage"))
    faults.reached("mid-commit", lambda: fired.append("mid-commit"))
    faults.reached("mid-commit", lambda: fired.append("mid-commit again"))
    assert fired == ["mid-commit"] and faults.was_hit(tmp_path, "mid-commit")
    assert not faults.disarm(tmp_path, "mid-commit")  # it was taken: nothing left to take back
    assert faults.passed(tmp_path) == {"after-stage", "mid-commit"}
    faults.arm(tmp_path, "after-stage")
    assert faults.disarm(tmp_path, "after-stage") and not faults.was_hit(tmp_path, "after-stage")


def clean_then_under_faults(tmp_path: Path, model: dict, inputs: dict[str, str]) -> tuple[Path, Path]:
    """Run the job failure-free in tmp_path/clean, then prepare it again in tmp_path/faulty with its
    own checkpoints and an empty fault directory; (the faulty work directory, its fault directory)."""
    prepare(tmp_path / "clean", model, inputs)
    code, err = run(tmp_path / "clean")
    assert code == 0, err
    workdir = tmp_path / "faulty"
    model["checkpoint"]["storage"]["local"]["path"] = str(workdir / "cp")
    prepare(workdir, model, inputs)
    (workdir / "faults").mkdir()
    return workdir, workdir / "faults"


def test_a_source_held_at_the_end_of_its_input_checkpoints_on_and_ends_once_let_go(tmp_path):
    """`nopstream chaos` holds a run's input at its end (`faults.holding`) until its schedule is done:
    epochs keep becoming durable while it is held, the job ends once it is let go, output unchanged."""
    from nopstream import faults
    from nopstream.local import kills

    inputs = {"part-0.txt": "a b c a\n" * 200}  # read in one batch: the job ends in an epoch or two
    model = wordcount_model("held-input", interval_ms=100)
    workdir, folder = clean_then_under_faults(tmp_path, model, inputs)
    faults.hold(folder, held=True)
    progress = kills.Progress(model)
    proc = start_job(workdir, env={faults.DIR_ENV: str(folder)})
    try:
        deadline = time.monotonic() + 120
        while progress.durable() < 12 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, f"the held job ended (exit {proc.returncode}): {proc.stderr.read()}"
        assert progress.durable() >= 12
        faults.hold(folder, held=False)
        assert proc.wait(120) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert committed(workdir, "out") == committed(tmp_path / "clean", "out")


def test_sink_steps_left_at_the_end_of_a_schedule_are_reached_in_turn_by_the_last_epoch(tmp_path):
    """Chaos arms the sink steps left at a schedule's end together and lets the input end
    (`kills.Schedule._finale`): a job that writes only at its end (final counts) stages and publishes
    its last epoch again after each of the three crashes, so each step is reached, output unchanged.
    Armed one at a time, the second would wait for a durable epoch the finished job never makes."""
    from nopstream import faults
    from nopstream.local import kills

    inputs = {"part-0.txt": "a b c a\n" * 200, "part-1.txt": "d e a\n" * 100}
    model = wordcount_model("final-steps", interval_ms=100)
    model["model"]["operators"][2]["emit"] = "final"
    workdir, folder = clean_then_under_faults(tmp_path, model, inputs)
    progress = kills.Progress(model)
    schedule = kills.Schedule(
        [kills.Event(point) for point in kills.FLOWING],
        random.Random(1),
        progress,
        folder,
        first_kill=(0, 0),
        between_kills=(0, 0),
        fault_wait=60,
        savepoint=lambda: True,
        deadline=time.monotonic() + 240,
    )
    proc = start_job(workdir, env={faults.DIR_ENV: str(folder)})
    try:
        while progress.durable() < 3 and proc.poll() is None:  # held at the end of its input meanwhile
            time.sleep(0.1)
        schedule.drive(proc)
        assert proc.wait(120) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    schedule.finish()
    assert sorted(schedule.reached.hit) == sorted(kills.FLOWING) and not schedule.reached.missed
    assert committed(workdir, "out") == committed(tmp_path / "clean", "out")
