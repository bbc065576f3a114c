"""`nopstream run --etcd` forks its processes ready-loaded from a zygote (`local.zygote`).

They are the command's own children under the titles they show in `ps`, none outlives
the command killed at once, and a zygote that died fails the command at its next start
of a process in one line, its committed output intact for the next run.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from nopstream.model.load import load_file
from nopstream.plan import compiler
from tests.checkpointing.test_faults import committed
from tests.leases.test_job import expected_then_start, start, titles, wait_for_commits


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def all_gone(pids: list[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def task_names(workdir: Path) -> list[str]:
    """The names of the job's tasks in its plan, in the order the supervisor starts them."""
    return [t.name for t in compiler.compile_model(load_file(workdir / "job.yaml")).deployment.tasks]


def test_the_job_s_processes_are_the_command_s_children_and_none_outlives_it_killed(tmp_path, etcd_server):
    job = "zygote-children"
    _, proc = expected_then_start(tmp_path, job, "{}:{}".format(*etcd_server.endpoint))
    try:
        wait_for_commits(etcd_server.endpoint, job, 1, proc)
        seen = titles(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    names = sorted(seen.values())
    coordinators = [n for n in names if n.startswith("nopstream coordinator ")]
    assert len(coordinators) == 2, names
    expected = [f"nopstream task {name}-r1" for name in task_names(tmp_path / "etcd")]
    assert sorted(set(names) - set(coordinators)) == sorted([*expected, f"nopstream zygote {job}"])
    assert all_gone(list(seen)), {p: t for p, t in seen.items() if alive(p)}


def test_a_zygote_that_died_fails_the_command_in_one_line_and_the_next_run_is_exact(tmp_path, etcd_server):
    job = "zygote-died"
    etcd = "{}:{}".format(*etcd_server.endpoint)
    expected, proc = expected_then_start(tmp_path, job, etcd)
    try:
        wait_for_commits(etcd_server.endpoint, job, 1, proc)
        seen = titles(proc.pid)
        (zygote,) = [p for p, t in seen.items() if t == f"nopstream zygote {job}"]
        os.kill(zygote, signal.SIGKILL)
        os.kill(next(p for p, t in seen.items() if t.startswith("nopstream task ")), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = task_names(tmp_path / "etcd")[0]
    assert proc.returncode == 3, err
    assert err.endswith(
        f"job '{job}' failed: cannot start {first}-r2: the zygote (pid {zygote}) that forks the job's"
        " processes has ended\n"
    ), err
    assert "Traceback" not in err
    assert all_gone(list(seen)), {p: t for p, t in seen.items() if alive(p)}
    again = start(tmp_path / "etcd", etcd)
    _, err = again.communicate(timeout=180)
    assert again.returncode == 0, err
    got = committed(tmp_path / "etcd", "out")
    assert got == expected, f"lost {sum((expected - got).values())}, doubled {sum((got - expected).values())}"
