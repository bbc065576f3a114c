"""Exactly-once off the paths the fault suite walks: each way a user starts, reruns or
disturbs a job, as a test that failed on main before the one rule for every start.

1. a crash before the first durable epoch (the dead run had staged records);
2. a finished job run again (processes and in-process), then started over with --fresh;
3. a finished job run again on etcd, and again after its storage and output were deleted;
4. two runs of one job at once;
5. two jobs whose sinks share an output directory and a sink id;
6. an input file truncated, or replaced, between runs;
7. the latest manifest deleted (refused, locally and on etcd), then --restore-from;
8. a segment of the restore point altered, or deleted (refused naming it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from nopstream.node.checkpointing import RestoreReport
from tests.chaos import jobs
from tests.conftest import ROOT, run_nopstream


def run(home: Path, *args: str, faults: str | None = None, timeout: float = 180, paced: bool = True):
    """`nopstream run` of the job in `home`; unpaced, its functions do not sleep (`CHAOS_PACE` 0)."""
    env = {"NOPSTREAM_FAULTS": faults} if faults else {}
    if not paced:  # a run nothing lands in the middle of
        env["CHAOS_PACE"] = "0"
    return run_nopstream("run", "job.yaml", *args, cwd=home, env=env, timeout=timeout)


def outputs(directory: Path) -> dict[str, str]:
    """Every committed file of a sink directory, by name."""
    return {p.name: p.read_text() for p in sorted(directory.glob("*.*")) if p.is_file()}


def records(directory: Path, *, lineage: int | None = None) -> Counter[str]:
    """The committed records of a sink directory (of one lineage), as a multiset."""
    out: Counter[str] = Counter()
    for name, text in outputs(directory).items():
        if lineage is None or f".l{lineage}." in name:
            out.update(json.dumps(json.loads(line), sort_keys=True) for line in text.splitlines())
    return out


def word_count(
    home: Path,
    *,
    job_id: str = "wc",
    emit: str = "final",
    interval: int = 200,
    sink: str = "out",
    retain: int = 3,
):
    """A paced word count over 4 files into `sink`, checkpoints in cp/ (the latest `retain` kept)."""
    model = jobs.rolling_count(home)
    checkpoint = {"intervalMs": interval, "retainLatest": retain, "storage": {"local": {"path": "cp"}}}
    model.update(jobId=job_id, checkpoint=checkpoint)
    model["model"]["operators"][2]["emit"] = emit
    model["model"]["sinks"][0]["config"]["path"] = sink
    return jobs.prepare(home, model)


def clean_records(tmp_path: Path, **kwargs) -> Counter[str]:
    """The failure-free output of `word_count(..., **kwargs)`, unpaced: nothing lands in it."""
    home = tmp_path / "clean"
    word_count(home, **kwargs)
    result = run(home, paced=False)
    assert result.code == 0, result.err
    return records(home / kwargs.get("sink", "out"))


def manifests(home: Path) -> list[Path]:
    return sorted(home.glob("cp/checkpoint/*/*/*/_manifest.json"), key=lambda p: int(p.parent.name))


def test_a_crash_before_the_first_durable_epoch_duplicates_nothing(tmp_path):
    # The whole command dies just before the first manifest, after every sink staged
    # epoch 1 (a long first epoch, so it holds records); the next start must not commit
    # the dead run's staged records on top of its own.
    expected = clean_records(tmp_path, emit="rolling", interval=1500)
    home = tmp_path / "crashed"
    word_count(home, emit="rolling", interval=1500)
    first = run(home, faults="coordinator-before-manifest@1")
    assert first.code == -signal.SIGKILL, first.err
    assert manifests(home) == []
    assert list((home / "out" / ".staging").iterdir()), "the dead run staged nothing"
    again = run(home)
    assert again.code == 0, again.err
    got = records(home / "out")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
    assert list((home / "out" / ".staging").iterdir()) == []


@pytest.mark.parametrize("mode", [[], ["--in-process"]], ids=["processes", "in-process"])
def test_a_finished_job_run_again_emits_nothing_and_fresh_starts_a_new_lineage(tmp_path, mode):
    home = tmp_path / "job"
    word_count(home)
    assert run(home, *mode, paced=False).code == 0
    before = outputs(home / "out")
    final = json.loads(manifests(home)[-1].read_text())
    assert final["kind"] == "final"
    again = run(home, *mode, paced=False)
    assert again.code == 0, again.err
    assert f"job 'wc' already finished at epoch {final['epoch']}" in again.err
    assert outputs(home / "out") == before
    fresh = run(home, *mode, "--fresh", paced=False)
    assert fresh.code == 0, fresh.err
    assert "already finished" not in fresh.err
    assert records(home / "out", lineage=2) == records(home / "out", lineage=1) != Counter()
    assert {k: v for k, v in outputs(home / "out").items() if ".l1." in k} == before
    assert (
        json.loads((home / "cp" / "checkpoint" / "wc" / "main" / "_lineage.json").read_text())["lineage"] == 2
    )


def test_a_finished_job_run_again_on_etcd_says_so_and_storage_wins(tmp_path, etcd_server):
    host, port = etcd_server.endpoint
    etcd = ["--etcd", f"{host}:{port}"]
    expected = clean_records(tmp_path)
    home = tmp_path / "job"
    word_count(home, job_id="wc-etcd")
    assert run(home, *etcd, paced=False).code == 0
    before = outputs(home / "out")
    assert records(home / "out") == expected
    again = run(home, *etcd, timeout=60, paced=False)
    assert again.code == 0, again.err
    assert "job 'wc-etcd' already finished at epoch" in again.err
    assert outputs(home / "out") == before
    # Storage deleted, output kept: the committed output shows a later epoch existed.
    subprocess.run(["rm", "-rf", str(home / "cp")], check=True)
    kept = run(home, *etcd, timeout=60, paced=False)
    assert kept.code == 1, kept.err
    assert "sink 'out' subtask 0 already committed epoch" in kept.err
    assert outputs(home / "out") == before
    # Storage and output deleted: etcd's record of a finished job is stale, storage wins.
    subprocess.run(["rm", "-rf", str(home / "cp"), str(home / "out")], check=True)
    over = run(home, *etcd, timeout=120, paced=False)
    assert over.code == 0, over.err
    assert "already finished" not in over.err
    assert records(home / "out") == expected


def second_while_first_runs(first_home: Path, second_home: Path):
    """Start the job in `first_home`; once it has a durable epoch, run the job in `second_home`
    while the first is stopped (SIGSTOP), then let the first end: (first's pid, its exit code,
    its stderr, the second's result).

    The first stands still while the second starts: on a busy machine the second's start
    took longer than the rest of the first run, which then had finished.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(first_home)])}
    first = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml"],
        cwd=first_home,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not manifests(first_home) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGSTOP)
        try:
            second = run(second_home)
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=180)
    finally:
        first.kill()
    return first.pid, first.returncode, err, second


def test_two_runs_of_one_job_at_once_the_second_is_refused(tmp_path):
    expected = clean_records(tmp_path)
    home = tmp_path / "job"
    word_count(home)
    pid, code, err, second = second_while_first_runs(home, home)
    assert second.code == 1, second.err
    assert (
        f"job 'wc' cannot run: checkpoint namespace 'wc/main' in {home / 'cp'} is held by"
        f" nopstream run (pid {pid}, since "
    ) in second.err
    assert code == 0, err
    assert records(home / "out") == expected


def test_two_jobs_sharing_an_output_directory_and_sink_id_keep_both_outputs(tmp_path):
    expected = clean_records(tmp_path)
    for job_id in ("a", "b"):
        word_count(tmp_path / job_id, job_id=job_id, sink=str(tmp_path / "shared"))
        result = run(tmp_path / job_id, paced=False)
        assert result.code == 0, result.err
    names = sorted(outputs(tmp_path / "shared"))
    assert {n.split(".", 1)[0] for n in names} == {"a", "b"}
    assert all(n.startswith(("a.main.l1.out.", "b.main.l1.out.")) for n in names), names
    assert records(tmp_path / "shared") == expected + expected


def kill_after_a_cursor(home: Path, path: str) -> dict[str, int]:
    """Run the job and SIGKILL all of it once a durable epoch has read part of a stripe of the file
    `path`; the cursors of that file's begun stripes in that epoch, by split id."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(home)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml"], cwd=home, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for found in manifests(home):
                manifest = json.loads(found.read_text())
                begun = {
                    split: cursor
                    for state in manifest["sources"].values()
                    for split, cursor in state.get("cursors", {}).items()
                    if split.startswith(f"{path}#") and cursor
                }
                if begun:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
                    return begun
            time.sleep(0.02)
        raise AssertionError("no durable epoch read part of the file")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("change", ["truncated", "replaced"])
def test_an_input_changed_under_its_cursor_is_refused_naming_the_split(tmp_path, change):
    home = tmp_path / "job"
    word_count(home, emit="rolling")
    path = str(home / "in" / "part-0.txt")
    # a long file: some durable epoch is taken while it is being read, even when a busy
    # machine holds the first epoch back until the other files are done
    Path(path).write_text(Path(path).read_text() * 10)
    begun = kill_after_a_cursor(home, path)
    size = min(begun.values()) // 2  # shorter than every begun stripe's cursor
    data = Path(path).read_bytes()
    if change == "truncated":
        Path(path).write_bytes(data[:size])
    else:
        Path(path).write_bytes(b"X" + data[1:])
    before = outputs(home / "out")
    result = run(home)
    assert result.code == 1, result.err
    # every begun stripe of the file is refused; the first of its tasks to refuse is named
    named = re.search(rf"split '({re.escape(path)}#\d+)' changed under its cursor: (.*)", result.err)
    assert named is not None, result.err
    split, rule = named.groups()
    assert split in begun
    if change == "truncated":
        assert rule == (
            f"the file has {size} bytes, the cursor is at byte {begun[split]}: a file being read must"
            " not shrink or be replaced (docs/runtime.md)"
        )
    else:
        assert rule == (
            "its file's first 4096 bytes differ: a file being read must not shrink or be replaced"
            " (docs/runtime.md)"
        )
    assert "Traceback" not in result.err
    # Nothing of a new epoch: only what was committed, and what the start rule commits of
    # the durable epoch it restored (when the kill came between its manifest and its commit).
    after = outputs(home / "out")
    assert {k: v for k, v in after.items() if k in before} == before
    durable = int(manifests(home)[-1].parent.name)
    assert all(int(name.split(".")[-2]) <= durable for name in after), sorted(after)


def test_a_deleted_latest_manifest_is_refused_then_restore_from_starts_a_lineage(tmp_path):
    home = tmp_path / "job"
    word_count(home, retain=20)
    assert run(home).code == 0
    before = outputs(home / "out")
    # The manifest of the latest epoch that committed output is gone (and any later one,
    # which committed nothing): restoring an older epoch would emit that output again.
    committed = max(int(name.split(".")[-2]) for name in before)
    for manifest in manifests(home):
        if int(manifest.parent.name) >= committed:
            manifest.unlink()
    previous = int(manifests(home)[-1].parent.name)
    subtask = next(name.split(".")[4] for name in before if int(name.split(".")[-2]) == committed)
    refused = run(home)
    assert refused.code == 1, refused.err
    assert (
        f"sink 'out' subtask {subtask} already committed epoch {committed}"
        f" ({home / 'out'}/wc.main.l1.out.{subtask}.{committed:010d}.jsonl),"
        f" after the restore point (epoch {previous}): the manifest of a later epoch is missing"
    ) in refused.err
    assert outputs(home / "out") == before
    again = run(home, "--restore-from", str(previous))
    assert again.code == 0, again.err
    assert {k: v for k, v in outputs(home / "out").items() if ".l1." in k} == before
    # what lineage 1 committed up to the restored epoch, and lineage 2 after it: the whole output once
    # (when the restored epoch was taken after the data ended, lineage 2 emits nothing again)
    upto = Counter(
        json.dumps(json.loads(line), sort_keys=True)
        for name, text in before.items()
        if int(name.split(".")[-2]) <= previous
        for line in text.splitlines()
    )
    assert upto + records(home / "out", lineage=2) == clean_records(tmp_path)


def test_a_deleted_latest_manifest_is_refused_on_etcd_by_the_epoch_log(tmp_path, etcd_server):
    host, port = etcd_server.endpoint
    home = tmp_path / "job"
    word_count(home, job_id="wc-log", sink="out")
    assert run(home, "--etcd", f"{host}:{port}").code == 0
    latest = manifests(home)[-1]
    epoch = int(latest.parent.name)
    latest.unlink()
    (home / "out").rename(home / "out-kept")  # so that only the epoch log can tell
    refused = run(home, "--etcd", f"{host}:{port}", timeout=60)
    assert refused.code == 1, refused.err
    assert (
        f"epoch {epoch} is durable in the epoch log but its manifest {home / 'cp'}/checkpoint/wc-log/main/"
        f"{epoch}/_manifest.json is missing or damaged"
    ) in refused.err
    assert not (home / "out").exists() or outputs(home / "out") == {}


@pytest.mark.parametrize("damage", ["altered", "deleted"])
def test_a_damaged_segment_of_the_restore_point_is_refused_naming_it(tmp_path, damage):
    # The command dies before epoch 3's manifest, so the next start restores epoch 2; one
    # of its keyed segments is then altered (same size, one digit changed) or deleted.
    home = tmp_path / "job"
    word_count(home, emit="rolling")
    assert run(home, faults="coordinator-before-manifest@3").code == -signal.SIGKILL
    epoch = int(manifests(home)[-1].parent.name)
    keyed = sorted(p for p in (home / "cp").glob(f"checkpoint/wc/main/{epoch}/count/*/*/acc"))
    segment = keyed[len(keyed) // 2]
    path = segment.relative_to(home / "cp").as_posix()
    if damage == "altered":
        data = segment.read_bytes()
        digit = max(i for i, b in enumerate(data) if chr(b).isdigit())
        segment.write_bytes(
            data[:digit] + (b"1" if data[digit : digit + 1] != b"1" else b"2") + data[digit + 1 :]
        )
        reason = "does not match its manifest entry (size or SHA-256 differ)"
    else:
        segment.unlink()
        reason = "is missing"
    before = outputs(home / "out")
    refused = run(home)
    assert refused.code == 1, refused.err
    assert f"segment {path} of epoch {epoch} {reason}" in refused.err
    assert "Traceback" not in refused.err, refused.err
    assert outputs(home / "out") == before


def restore_reports(logs: Path) -> list[RestoreReport]:
    """The restore reports in a run's task logs."""
    lines = [line for f in sorted(logs.glob("*.log")) for line in f.read_text().splitlines()]
    return [r for r in map(RestoreReport.from_line, lines) if r is not None]


def test_every_task_start_reports_what_it_restored(tmp_path):
    """The restore reports `nopstream chaos` counts: a start from a durable epoch taken mid-file
    reports that epoch, its cursors and keyed entries; a start from nothing reports nothing."""
    home = tmp_path / "job"
    word_count(home, emit="rolling")
    path = str(home / "in" / "part-0.txt")
    Path(path).write_text(Path(path).read_text() * 10)
    begun = kill_after_a_cursor(home, path)
    logs = home / ".nopstream" / "runs" / "wc" / "run-1" / "logs"
    assert {r.epoch for r in restore_reports(logs)} == {None}  # the killed run started from nothing
    restored = int(manifests(home)[-1].parent.name)
    result = run(home)
    assert result.code == 0, result.err
    reports = restore_reports(logs)
    assert len(reports) == 3 + 3 + 2 and {r.epoch for r in reports} == {restored}, reports
    sources = [r for r in reports if "/lines/" in r.task_id]
    counts = [r for r in reports if "/count/" in r.task_id]
    assert sum(r.cursors for r in sources) >= len(begun) >= 1
    assert sum(r.keyed_entries for r in counts) > 0 and sum(r.timers for r in reports) == 0
