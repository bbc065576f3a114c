"""A running job coordinated through a real etcd server (`nopstream run --etcd`): failures of every part.

Each job runs twice: once on the embedded default (no etcd, no faults) for the
expected output, and once with coordinator and task processes coordinated through
etcd while something fails. The committed outputs must be equal as multisets.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e import servers
from nopstream import faults
from nopstream.checkpoint import catalog
from nopstream.checkpoint.formats import manifest_path
from nopstream.checkpoint.storage import LocalStorage
from nopstream.cluster.backend import StoreUnavailable
from nopstream.cluster.epochlog import EpochLog
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.registry import Registry
from nopstream.plan.epochs import EpochState
from tests.checkpointing.test_faults import committed, prepare, run, wordcount_model
from tests.conftest import ROOT


def paced_wordcount(job_id: str, *, interval_ms: int = 300) -> dict:
    """A rolling word count over generated lines paced to about eight seconds (1,500 lines/s)."""
    model = wordcount_model(job_id, interval_ms=interval_ms)
    model["model"]["sources"] = [
        {
            "id": "lines",
            "type": "generator",
            "config": {"kind": "words", "count": 12000, "ratePerSecond": 1500, "vocabulary": 500},
        }
    ]
    return model


def start(workdir: Path, etcd: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT), str(workdir)])}
    return subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", "--etcd", etcd],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def titles(pid: int) -> dict[int, str]:
    """The children of `pid` by PID, each as its title in `ps` (Linux /proc; none once it is gone)."""
    found = {}
    try:
        pids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return {}
    for child in pids:
        try:
            found[int(child)] = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode()
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def children(pid: int) -> dict[str, int]:
    """The supervisor's processes by their NOPSTREAM_ATTEMPT name, which each shows in `ps` after its
    role (`nopstream task NAME`)."""
    found = {}
    for child, title in titles(pid).items():
        words = title.split(" ")
        if words[:1] == ["nopstream"] and words[1:2] in (["task"], ["coordinator"]) and len(words) == 3:
            found[words[2]] = child
    return found


def coordination(etcd: tuple[str, int], job: str):
    """(epoch-log entries, current run, leader name) of a local job."""

    async def read():
        backend = EtcdBackend(*etcd)
        layout = Layout("local", job, "main")
        try:
            entry = await backend.get(layout.coordinator)
            leader = json.loads(entry.value)["candidate"] if entry else None
            return (
                await EpochLog(backend, layout).entries(),
                await Registry(backend, layout).current_run(),
                leader,
            )
        finally:
            await backend.close()

    return asyncio.run(read())


def wait_for_commits(etcd: tuple[str, int], job: str, count: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            entries, _, _ = coordination(etcd, job)
        except StoreUnavailable:  # this reader's own connection timed out on a busy machine (CI)
            continue
        if sum(e.state is EpochState.COMMITTED for e in entries) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{job}: fewer than {count} committed epochs before the job ended")


def expected_then_start(
    tmp_path: Path,
    job_id: str,
    etcd: str,
    *,
    retain: int = 3,
    interval_ms: int = 300,
    env: dict[str, str] | None = None,
) -> tuple[object, subprocess.Popen[str]]:
    """The paced word count's failure-free output (embedded default), then the job started on etcd
    (keeping the latest `retain` durable epochs, with `env`)."""
    model = paced_wordcount(job_id, interval_ms=interval_ms)
    model["checkpoint"]["retainLatest"] = retain
    unpaced = copy.deepcopy(model)  # nothing lands in the failure-free run: it only has to end
    del unpaced["model"]["sources"][0]["config"]["ratePerSecond"]
    prepare(tmp_path / "clean", unpaced, {})
    code, err = run(tmp_path / "clean")
    assert code == 0, err
    expected = committed(tmp_path / "clean", "out")
    assert expected
    prepare(tmp_path / "etcd", model, {})
    return expected, start(tmp_path / "etcd", etcd, env)


def test_coordinator_failover_mid_job_keeps_the_run_and_the_output(tmp_path, etcd_server, capsys):
    job = "etcd-coordinator-failover"
    expected, proc = expected_then_start(tmp_path, job, "{}:{}".format(*etcd_server.endpoint))
    try:
        wait_for_commits(etcd_server.endpoint, job, 2, proc)
        before, _, leader = coordination(etcd_server.endpoint, job)
        assert {e.writer for e in before} == {leader}
        assert before[-1].kind != "final"
        os.kill(children(proc.pid)[leader], signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "recovering" not in err  # no global recovery: the tasks kept running
    entries, run_now, _ = coordination(etcd_server.endpoint, job)
    assert run_now == 1
    writers = {e.writer for e in entries}
    assert leader in writers and len(writers) == 2, writers
    new_leader_entries = [e for e in entries if e.writer != leader]
    assert new_leader_entries[-1].state is EpochState.COMMITTED
    assert new_leader_entries[-1].kind == "final"
    with capsys.disabled():
        print(
            f"\n[etcd job] coordinator {leader} killed; job ended {time.monotonic() - killed_at:.2f}s later"
        )
    got = committed(tmp_path / "etcd", "out")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"


def test_a_deposed_coordinator_resumed_mid_commit_writes_a_manifest_no_restore_reads(
    tmp_path, etcd_server, capsys
):
    """The leader stops itself (SIGSTOP) with every ACK of an epoch in, before its manifest; a task is
    killed, and the other candidate leads a new run that restores an earlier epoch; then the paused
    one is continued and writes its manifest. That epoch is superseded: never durable, never restored,
    and the output is exact."""
    job = "etcd-deposed-writer"
    faults_dir = tmp_path / "faults"
    faults_dir.mkdir()
    etcd = "{}:{}".format(*etcd_server.endpoint)
    env = {"NOPSTREAM_FAULTS_DIR": str(faults_dir)}
    # epochs 1.5 s apart: the late manifest is looked for before the new run's next durable epoch, whose
    # retention deletes it (superseded, an orphan)
    expected, proc = expected_then_start(tmp_path, job, etcd, retain=1000, interval_ms=1500, env=env)
    storage = LocalStorage(tmp_path / "etcd" / "cp")
    namespace = f"{job}/main"
    try:
        wait_for_commits(etcd_server.endpoint, job, 2, proc)
        faults.arm(faults_dir, "coordinator-before-manifest", pause=True)
        deadline = time.monotonic() + 30
        while not faults.was_hit(faults_dir, "coordinator-before-manifest"):
            assert time.monotonic() < deadline and proc.poll() is None, "no leader reached its manifest"
            time.sleep(0.05)
        _, _, paused = coordination(etcd_server.endpoint, job)
        processes = children(proc.pid)
        os.kill(next(p for n, p in processes.items() if "coordinator" not in n), signal.SIGKILL)
        while not catalog.Stored.read(storage, namespace).restores:  # the new run, led by the other
            assert time.monotonic() < deadline + 60 and proc.poll() is None, "no new run restored"
            time.sleep(0.1)
        (kept, first) = next(iter(catalog.Stored.read(storage, namespace).restores))
        recorded = (storage.root / catalog.restore_path(namespace, kept, first)).stat().st_mtime
        os.kill(processes[paused], signal.SIGCONT)
        late = _superseded_manifest(storage, namespace, within=10)
        seen = catalog.Stored.read(storage, namespace)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert late is not None, "the resumed coordinator wrote no manifest"
    epoch, written = late
    assert kept < epoch < first and written > recorded
    assert epoch not in seen.durable() and seen.latest_durable() != epoch
    with capsys.disabled():
        print(f"\n[etcd job] a deposed leader's manifest of epoch {epoch} landed after a run kept {kept}")
    got = committed(tmp_path / "etcd", "out")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"


def _superseded_manifest(storage: LocalStorage, namespace: str, *, within: float) -> tuple[int, float] | None:
    """(epoch, time written) of the first manifest of a superseded epoch seen within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        stored = catalog.Stored.read(storage, namespace)
        for epoch, paths in stored.epochs.items():
            path = manifest_path(namespace, epoch)
            if path in paths and stored.superseded(epoch):
                with contextlib.suppress(FileNotFoundError):
                    return epoch, (storage.root / path).stat().st_mtime
        time.sleep(0.01)
    return None


def test_task_kills_recover_globally_through_the_run_in_etcd(tmp_path, etcd_server, capsys):
    job = "etcd-task-kills"
    expected, proc = expected_then_start(tmp_path, job, "{}:{}".format(*etcd_server.endpoint))
    rng = random.Random(4)
    kills = 0
    try:
        wait_for_commits(etcd_server.endpoint, job, 1, proc)
        while kills < 3 and proc.poll() is None:
            tasks = {n: p for n, p in children(proc.pid).items() if "coordinator" not in n}
            if tasks:
                os.kill(tasks[rng.choice(sorted(tasks))], signal.SIGKILL)
                kills += 1
            time.sleep(rng.uniform(1.5, 3.0))
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    entries, run_now, _ = coordination(etcd_server.endpoint, job)
    recoveries = err.count("recovering: ")
    assert kills >= 2 and recoveries == run_now - 1 >= 2, (kills, recoveries, run_now, err)
    assert entries[-1].state is EpochState.COMMITTED and entries[-1].kind == "final"
    with capsys.disabled():
        print(f"\n[etcd job] {kills} task SIGKILLs, run advanced to {run_now}")
    got = committed(tmp_path / "etcd", "out")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"


def test_etcd_outage_longer_than_the_lease_ends_with_the_job_complete_and_exact(tmp_path, capsys):
    job = "etcd-outage"
    etcd = servers.start_etcd(tmp_path / "etcd-server")
    host, port = etcd.endpoint
    expected, proc = expected_then_start(tmp_path, job, f"{host}:{port}")
    try:
        wait_for_commits(etcd.endpoint, job, 2, proc)
        before, _, _ = coordination(etcd.endpoint, job)
        etcd.stop()
        time.sleep(8)  # twice the lease TTL of the job's processes (4 s)
        etcd = servers.start_etcd(tmp_path / "etcd-server", data_dir=etcd.data_dir, client_port=port)
        _, err = proc.communicate(timeout=240)
        entries, run_now, _ = coordination(etcd.endpoint, job)
    finally:
        if proc.poll() is None:
            proc.kill()
        etcd.stop()
    assert proc.returncode == 0, err
    durable_before = max(e.epoch for e in before if e.state is not EpochState.CREATED)
    assert entries[-1].state is EpochState.COMMITTED and entries[-1].kind == "final"
    assert entries[-1].epoch > durable_before
    with capsys.disabled():
        print(f"\n[etcd job] etcd stopped 8 s; job went on (run {run_now}) and ended")
    got = committed(tmp_path / "etcd", "out")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"


def test_a_task_lost_after_the_final_epoch_is_committed_still_gets_its_recovery_led(tmp_path, etcd_server):
    """The only epoch is the final one (a 60 s interval); each sink dies before publishing it.

    The coordinator has committed it and exited 0 by then: the recovery's run needs a
    coordinator of its own to say "finished", or its tasks wait for a restore point for ever.
    """
    job = "etcd-final-lost"
    model = wordcount_model(job, interval_ms=60_000)
    words = " ".join(f"w{i % 50}" for i in range(400))
    inputs = {f"part-{i}.txt": f"{words}\n" * 5 for i in range(4)}
    prepare(tmp_path / "clean", model, inputs)
    code, err = run(tmp_path / "clean")
    assert code == 0, err
    expected = committed(tmp_path / "clean", "out")
    prepare(tmp_path / "etcd", model, inputs)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path / "etcd")]),
        "NOPSTREAM_FAULTS": "before-publish@1",
    }
    etcd = "{}:{}".format(*etcd_server.endpoint)
    done = subprocess.run(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", "--etcd", etcd],
        cwd=tmp_path / "etcd", env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    entries, run_now, _ = coordination(etcd_server.endpoint, job)
    assert [(e.epoch, e.kind) for e in entries] == [(1, "final")]
    assert run_now == 2 and done.stderr.count("recovering: ") == 1, done.stderr
    got = committed(tmp_path / "etcd", "out")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"


@pytest.mark.parametrize("when", ["at-start", "mid-run"])
def test_etcd_that_loses_the_jobs_keys_gets_a_new_run_and_the_output_stays_exact(tmp_path, etcd_server, when):
    """etcd lost its data (the chart's bundled etcd keeps it in an emptyDir): the run went back to
    0, run 1 was reused, and a job whose keys were lost at its start hung for ever in silence.
    Every key of the job is deleted as soon as its run is written, or after its first commit:
    the supervisor sees its run gone, records a new run past it, and the job ends exact
    (checkpoint storage is the truth)."""
    job = f"etcd-wiped-{when}"
    expected, proc = expected_then_start(tmp_path, job, "{}:{}".format(*etcd_server.endpoint))

    async def wipe() -> int:
        backend = EtcdBackend(*etcd_server.endpoint)
        try:
            keys = await backend.get_prefix(Layout("local", job, "main").prefix)
            for key in keys:
                await backend.delete(key)
            return len(keys)
        finally:
            await backend.close()

    try:
        if when == "mid-run":
            wait_for_commits(etcd_server.endpoint, job, 1, proc)
        else:
            deadline = time.monotonic() + 60
            while coordination(etcd_server.endpoint, job)[1] < 1:
                assert time.monotonic() < deadline and proc.poll() is None, "the run was never written"
                time.sleep(0.02)
        assert asyncio.run(wipe()) > 0
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert (
        "recovering: etcd lost the job's coordination state (its run reads 0, the run is 1) (run 1 -> 2"
        in err
    )
    _, run_now, _ = coordination(etcd_server.endpoint, job)
    assert run_now >= 2  # never run 1 again
    got = committed(tmp_path / "etcd", "out")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"


def test_etcd_with_nothing_listening_is_waited_for_then_refused_in_one_line(tmp_path):
    port = servers.free_port()
    home = tmp_path / "job"
    prepare(home, paced_wordcount("no-etcd"), {})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(home)])}
    began = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nopstream",
            "run",
            "job.yaml",
            "--etcd",
            f"127.0.0.1:{port}",
            "--etcd-wait",
            "4",
        ],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    waited = time.monotonic() - began
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith(f"waiting for etcd at 127.0.0.1:{port} (at most 4 s)\n"), proc.stderr
    refused = f"etcd at 127.0.0.1:{port} did not answer within 4 s (is it running there?)"
    assert proc.stderr.endswith(f"job 'no-etcd' cannot start: {refused}\n"), proc.stderr
    assert 4 <= waited < 30
