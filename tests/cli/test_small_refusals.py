"""The hardening issue's small ones: each a line and a test (exact message, exit code, nothing left).

A work directory that is a file or under /proc; `validate` of /dev/zero, a FIFO or a
huge file; a secret file whose contents an error would echo; an empty graph; a `~/`
path; chaos and run options out of range; `/healthz` of the local control server;
SIGTERM to `nopstream run`; a task process given a task id its plan does not have.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from nopstream.model.load import load_data
from nopstream.node.view.jobview import JobHistory
from nopstream.node.wire import guard
from nopstream.node.wire.coordinator_api import CoordinatorRoutes
from nopstream.plan import compiler
from tests.cli.test_bad_input import job, one_issue, validate, write
from tests.conftest import ROOT, run_nopstream, serving


def test_a_work_directory_that_cannot_be_one_is_refused_in_one_line(tmp_path):
    write(tmp_path, job())
    (tmp_path / "a-file").write_text("x")
    for workdir, why in (("a-file", "File exists"), ("/proc/nopstream", "No such file or directory")):
        result = run_nopstream("run", "job.yaml", "--workdir", workdir, cwd=tmp_path)
        assert result.code == 3, result.err
        assert (
            result.err == f"job 'bad' cannot start: the work directory '{workdir}' cannot be created: {why}\n"
        )
    result = run_nopstream("run", "job.yaml", "--workdir", "", cwd=tmp_path)
    assert result.code == 2 and "argument --workdir: an empty path is not a directory" in result.err
    assert not (tmp_path / "cp").exists() and not (tmp_path / "out").exists()


def test_validate_reads_only_a_regular_file_of_bounded_size(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "huge.yaml").write_text("# " + "x" * (1 << 20) + "\n")
    for name, why in (
        ("/dev/zero", "is not a regular file"),
        (str(tmp_path / "fifo"), "is not a regular file"),
        (str(tmp_path / "huge.yaml"), "is larger than 1,048,576 bytes"),
    ):
        result = run_nopstream("validate", name, cwd=tmp_path, timeout=20)
        one_issue(result, f"{name}: {why} (rule: file-readable)")


def test_a_secret_file_is_never_echoed(tmp_path):
    write(tmp_path, job())
    secret = tmp_path / "secret"
    secret.write_text("do-not-show-me-" * 3 + "\nsecond line of it")
    result = run_nopstream(
        "status", "job.yaml", "--url", "http://127.0.0.1:1", "--secret-file", str(secret), cwd=tmp_path
    )
    assert result.code == 1, result.err
    assert "do-not-show-me" not in result.err + result.out
    assert f"{secret}: the job secret must be printable ASCII without spaces" in result.err


def test_an_empty_graph_is_refused(tmp_path):
    result = validate(tmp_path, {"jobId": "empty", "model": {"sources": [], "sinks": []}})
    assert result.code == 1
    assert result.err == (
        "invalid: 2 issue(s)\n"
        "  model.sinks: a job needs at least one sink (rule: connected)\n"
        "  model.sources: a job needs at least one source (rule: connected)\n"
    )


def test_a_path_starting_with_a_tilde_is_refused_not_taken_literally(tmp_path):
    model = job()
    model["model"]["sinks"][0]["config"]["path"] = "~/out"
    result = validate(tmp_path, model)
    one_issue(
        result,
        "model.sinks[0].config.path: '~/out' starts with '~', which is not expanded: write the directory out"
        " (rule: write-path)",
    )


def test_options_out_of_range_are_usage_errors(tmp_path):
    write(tmp_path, job())
    for args, why in (
        (["chaos", "job.yaml", "--kills", "-3"], "argument --kills: -3 is below 1"),
        (["chaos", "job.yaml", "--pace", "-5"], "argument --pace: -5 is below 0"),
        (["chaos", "job.yaml", "--timeout", "0"], "argument --timeout: 0 is not a number of seconds above 0"),
        (["run", "job.yaml", "--max-restarts", "-1"], "argument --max-restarts: -1 is below 0"),
        (
            ["run", "job.yaml", "--restart-backoff", "-0.5"],
            "argument --restart-backoff: -0.5 is not a number of seconds, 0 or more",
        ),
        (
            ["run", "job.yaml", "--etcd", "nope"],
            "argument --etcd: 'nope' is not HOST:PORT (a port from 1 to 65535)",
        ),
        (["status", "job.yaml", "--etcd", "h:99999"], "argument --etcd: 'h:99999' is not HOST:PORT"),
        (
            ["run", "job.yaml", "--etcd-wait", "0"],
            "argument --etcd-wait: 0 is not a number of seconds above 0",
        ),
        (["run", "job.yaml", "--etcd-wait", "5"], "nopstream run: --etcd-wait needs --etcd"),
    ):
        result = run_nopstream(*args, cwd=tmp_path)
        assert result.code == 2 and why in result.err, (args, result.err)
    for name, value, why in (
        ("NOPSTREAM_BATCH_SIZE", "0", "NOPSTREAM_BATCH_SIZE=0 must be at least 1"),
        ("NOPSTREAM_BATCH_TARGET_MS", "fast", "NOPSTREAM_BATCH_TARGET_MS='fast' is not an integer"),
        ("NOPSTREAM_SOURCE_PAUSE_MS", "-1", "NOPSTREAM_SOURCE_PAUSE_MS=-1 must be at least 0"),
    ):
        result = run_nopstream("run", "job.yaml", cwd=tmp_path, env={name: value})
        assert (result.code, result.err) == (2, f"nopstream run: {why}\n"), result.err
        assert not (tmp_path / ".nopstream").exists()


def test_the_local_control_server_answers_healthz(tmp_path):
    plans = compiler.compile_model(load_data(job()))
    routes = CoordinatorRoutes(
        plans.partitioned.task_ids(), guard.Guard(guard.new_secret()), JobHistory(plans.partitioned)
    )

    async def ask() -> tuple[int, str]:
        async with (
            serving(routes) as url,
            aiohttp.ClientSession() as session,
            session.get(f"{url}/healthz") as resp,  # no secret: it tells nothing
        ):
            return resp.status, await resp.text()

    assert asyncio.run(ask()) == (200, '{"ok": true}')


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(c) for c in (task / "children").read_text().split())
    return found


@pytest.mark.parametrize(
    ("stop", "code", "said"),
    [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted")],
    ids=["sigterm", "ctrl-c"],
)
def test_sigterm_or_ctrl_c_stops_a_run_says_what_it_kept_and_leaves_nothing_behind(
    tmp_path, stop, code, said
):
    model = job()
    model["model"]["sources"] = [
        {"id": "lines", "type": "generator", "config": {"count": 10**6, "ratePerSecond": 1000}}
    ]
    model["model"]["operators"] = []
    write(tmp_path, model)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", "--quiet"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = tmp_path / ".nopstream" / "runs" / "bad" / "run-1"
    deadline = time.monotonic() + 30
    while not list(run_dir.glob("logs/*.log")) or not (run_dir / "control-url").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the run never started"
        time.sleep(0.05)
    deadline = time.monotonic() + 30
    while not list((tmp_path / "cp").glob("checkpoint/bad/main/*/_manifest.json")):
        assert time.monotonic() < deadline and proc.poll() is None, "no durable epoch"
        time.sleep(0.05)
    tasks = _children(proc.pid)
    names = {Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode() for pid in tasks}
    assert names == {"nopstream task bad/main/lines/0"}  # named in ps (the sink is chained to it)
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    kept = max(int(p.parent.name) for p in (tmp_path / "cp").glob("checkpoint/bad/main/*/_manifest.json"))
    assert err == (
        f"nopstream run: {said}: job 'bad' keeps epoch {kept}, its latest durable one, whose output is"
        " committed: running it again resumes from there\n"
    )
    assert not (run_dir / "control-url").exists() and not (run_dir / "secret").exists()
    assert not [pid for pid in tasks if Path(f"/proc/{pid}").exists()]


def test_a_task_process_given_a_task_id_its_plan_lacks_says_so(tmp_path):
    plans = compiler.compile_model(load_data(job()))
    (tmp_path / "partitioned.json").write_text(compiler.dump_document(plans.partitioned))
    (tmp_path / "deployment.json").write_text(compiler.dump_document(plans.deployment))
    (tmp_path / "secret").write_text(guard.new_secret())
    env = {
        "NOPSTREAM_PLAN_DIR": str(tmp_path),
        "NOPSTREAM_ETCD": "127.0.0.1:1",
        "NOPSTREAM_ATTEMPT": "a",
        "NOPSTREAM_SECRET_FILE": str(tmp_path / "secret"),
        "NOPSTREAM_TASK_ID": "nope",
        "NOPSTREAM_RUN": "1",
    }
    result = run_nopstream("task", cwd=tmp_path, env=env)
    assert result.code == 2, result.err
    assert result.err == (
        "nopstream task: NOPSTREAM_TASK_ID='nope' is not a task of the plan (bad/main/lines/0)\n"
    ), result.err


def test_a_full_disk_fails_the_run_in_a_line_naming_the_file_without_a_traceback(tmp_path):
    """A full disk gave a traceback instead of the documented line naming the object.

    A real full file system: a 256 KiB tmpfs of the test's own, unmounted after.
    """
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], check=True)
    try:
        model = job()
        model["model"]["sources"] = [{"id": "lines", "type": "generator", "config": {"count": 200_000}}]
        model["model"]["operators"] = []
        model["model"]["sinks"][0]["config"]["path"] = str(small / "out")
        write(tmp_path, model)
        result = run_nopstream("run", "job.yaml", "--quiet", "--max-restarts", "1", cwd=tmp_path)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)
    assert result.code == 3, result.err
    assert "Traceback" not in result.err
    assert (
        f"OSError: [Errno 28] No space left on device: '{small / 'out' / '.staging'}/bad.main.l1.out.0."
        in result.err
    )


def test_status_with_etcd_down_says_so_in_one_line(tmp_path):
    from e2e import servers

    write(tmp_path, job())
    port = servers.free_port()
    result = run_nopstream("status", "job.yaml", "--etcd", f"127.0.0.1:{port}", cwd=tmp_path, timeout=60)
    assert result.code == 1, result.err
    assert result.err.startswith(f"job 'bad': etcd at 127.0.0.1:{port} did not answer: ")
    assert result.err.count("\n") == 1 and "Traceback" not in result.err


def test_a_new_command_keeps_the_last_commands_task_logs(tmp_path):
    write(tmp_path, job())
    assert run_nopstream("run", "job.yaml", "--quiet", cwd=tmp_path).code == 0
    runs = tmp_path / ".nopstream" / "runs" / "bad"
    first = {p.name: p.read_bytes() for p in (runs / "run-1" / "logs").iterdir()}
    assert first and all(first.values())
    assert run_nopstream("run", "job.yaml", "--quiet", "--fresh", cwd=tmp_path).code == 0
    kept = {p.name: p.read_bytes() for p in (runs / "previous" / "run-1" / "logs").iterdir()}
    assert kept == first
    second = {p.name: p.read_bytes() for p in (runs / "run-1" / "logs").iterdir()}
    assert second.keys() == first.keys() and second != first
