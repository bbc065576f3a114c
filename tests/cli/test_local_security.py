"""Another user on the same machine, and one job run twice: what nopstream writes cannot be redirected.

Each test plants what a careless or hostile local user would (a directory of theirs, a
link at a name we write, a secret file made first) or runs one job twice from two
working directories, and asserts the exact refusal and that nothing was written
through. The other user is uid 65534 (`nobody`): the suite runs as root, which may
hand a directory to another user.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nopstream import safefiles
from nopstream.checkpoint.storage import LocalStorage
from nopstream.connectors.files import FileSink
from nopstream.connectors.staged import OutputConflict, SinkName
from nopstream.errors import StartRefused
from nopstream.local import ownership
from nopstream.model.load import load_data
from nopstream.node.wire import guard
from nopstream.plan import compiler
from nopstream.records import Batch
from tests.checkpointing.test_every_start import (
    clean_records,
    manifests,
    records,
    run,
    second_while_first_runs,
    word_count,
)

OTHER = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's directory")


def foreign(path: Path) -> Path:
    """`path` made a directory of the other user."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, OTHER, OTHER)
    return path


def test_one_job_run_from_two_working_directories_into_one_output_the_second_is_refused(tmp_path):
    shared = tmp_path / "shared"
    expected = clean_records(tmp_path)
    first_home, second_home = tmp_path / "one", tmp_path / "two"
    for home in (first_home, second_home):
        word_count(home, sink=str(shared))  # each its own checkpoints (cp/ in its directory)
    pid, code, err, second = second_while_first_runs(first_home, second_home)
    assert second.code == 1, second.err
    held = f"job 'wc' cannot run: sink 'out' output {shared} is held by nopstream run"
    assert f"{held} (pid {pid}, since " in second.err
    assert "(one running job per sink output)" in second.err
    assert not manifests(second_home)
    assert code == 0, err
    assert records(shared) == expected


def _plan(sink: dict) -> compiler.CompiledPlans:
    model = {
        "jobId": "k",
        "semanticMode": "EFFECTIVELY_ONCE",
        "checkpoint": {"storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [{"id": "gen", "type": "generator", "config": {"count": 10}}],
            "sinks": [{"id": "out", "inputs": ["gen"], **sink}],
        },
    }
    return compiler.compile_model(load_data(model))


@pytest.mark.parametrize(
    ("sink", "named"),
    [
        (
            {"type": "kafka", "config": {"bootstrapServers": "127.0.0.1:1", "topic": "t"}},
            "kafka topic 't' at 127.0.0.1:1",
        ),
        ({"type": "s3", "config": {"bucket": "bkt", "prefix": "p/"}}, "s3://bkt/p/"),
        (
            {"type": "postgres", "config": {"database": "d", "user": "u", "table": "t", "columns": ["a"]}},
            "postgresql table t in d at 127.0.0.1:5432",
        ),
    ],
)
def test_a_sink_output_is_held_by_one_run_whatever_its_checkpoint_storage(tmp_path, sink, named):
    plan = _plan(sink).partitioned
    with (
        ownership.hold(LocalStorage(tmp_path / "a"), plan, holder="first"),
        pytest.raises(ownership.NamespaceHeld) as held,
        ownership.hold(LocalStorage(tmp_path / "b"), plan, holder="second"),
    ):
        pass
    assert str(held.value).startswith(
        f"sink 'out' output {named} is held by first (pid {os.getpid()}, since "
    )
    with ownership.hold(LocalStorage(tmp_path / "b"), plan, holder="second"):
        pass  # released with its holder


def test_a_work_directory_of_another_user_or_open_to_all_is_refused_before_anything_starts(tmp_path):
    word_count(tmp_path / "job")
    for workdir, why in (
        (foreign(tmp_path / "theirs"), f"'{tmp_path / 'theirs'}' is owned by another user (uid {OTHER})"),
        (tmp_path / "open", f"'{tmp_path / 'open'}' is writable by every user and not sticky"),
    ):
        workdir.mkdir(exist_ok=True)
        if workdir.name == "open":
            workdir.chmod(0o777)
        result = run(tmp_path / "job", "--workdir", str(workdir))
        assert result.code == 3, result.err
        refused = f"job 'wc' cannot start: the work directory '{workdir}' is not safe to write: {why}"
        assert refused in result.err
        assert list(workdir.iterdir()) == []
        assert not (tmp_path / "job" / "cp").exists()


def test_a_runs_directory_planted_by_another_user_is_refused(tmp_path):
    word_count(tmp_path / "job")
    planted = foreign(tmp_path / "job" / ".nopstream" / "runs")
    result = run(tmp_path / "job")
    assert result.code == 3, result.err
    assert (
        f"the run files directory '{Path('.nopstream/runs')}' is owned by another user (uid {OTHER})"
        in result.err
    )
    assert list(planted.iterdir()) == []


def test_run_files_are_private_and_the_secret_is_never_written_through_a_link(tmp_path):
    target = tmp_path / "victim"
    target.write_text("root's file\n")
    private = safefiles.private_dir(tmp_path / "runs", what="run files")
    (private / "secret").symlink_to(target)
    guard.write_secret(private / "secret", "s" * 64)
    assert target.read_text() == "root's file\n"
    st = os.lstat(private / "secret")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    # a directory of ours merely readable by others is narrowed; one writable by others is refused
    (tmp_path / "readable").mkdir(mode=0o755)
    safefiles.private_dir(tmp_path / "readable", what="run files")
    assert stat.S_IMODE(os.stat(tmp_path / "readable").st_mode) == 0o700
    (tmp_path / "writable").mkdir()
    (tmp_path / "writable").chmod(0o777)
    with pytest.raises(safefiles.UnsafePath, match="is writable by other users"):
        safefiles.private_dir(tmp_path / "writable", what="run files")


def test_lock_files_are_never_opened_through_a_link_nor_in_a_directory_another_user_made(
    tmp_path, monkeypatch
):
    target = tmp_path / "victim"
    target.write_text("root's file\n")
    (tmp_path / "x.lock").symlink_to(target)
    with pytest.raises(safefiles.UnsafePath, match=r"cannot be opened: .* \(a link is never followed\)"):
        safefiles.open_lock(tmp_path / "x.lock")
    assert target.read_text() == "root's file\n"
    theirs = tmp_path / "theirs.lock"
    theirs.write_text("holder of their choosing\n")
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(safefiles.UnsafePath, match="is not a file of yours"):
        safefiles.open_lock(theirs)
    # the private directory of S3 storage's locks: made first by another user, it is refused
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    foreign(tmp_path / f"nopstream-{os.geteuid()}")
    with pytest.raises(safefiles.UnsafePath, match=f"is owned by another user \\(uid {OTHER}\\)"):
        safefiles.user_dir()


def _sink(directory: Path) -> FileSink:
    return FileSink({"path": str(directory)}, name=SinkName("j", "main", "out", 0))


def test_the_file_sink_refuses_a_directory_another_user_could_redirect(tmp_path):
    for directory, why in (
        (foreign(tmp_path / "theirs"), f"is owned by another user (uid {OTHER})"),
        (foreign(tmp_path / "mine") / "staging-theirs", None),
    ):
        if why is None:  # our directory, a staging directory planted in it by the other user
            directory = tmp_path / "mine"
            os.chown(directory, 0, 0)
            foreign(directory / ".staging")
            why = f"staging directory '{directory / '.staging'}' is owned by another user (uid {OTHER})"
        with pytest.raises(StartRefused, match=why.replace("(", "\\(").replace(")", "\\)")):
            _sink(directory)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(StartRefused, match="is writable by every user and not sticky"):
        _sink(open_to_all)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    _sink(sticky)  # like /tmp: nobody may rename what is ours


def test_the_file_sink_never_writes_or_publishes_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    sink = _sink(tmp_path / "out")
    staged = sink._staged(1)
    staged.symlink_to(victim)  # as if planted before the transaction began
    sink.write(Batch(["a", "b"]))
    sink.prepare(1)
    assert victim.read_text() == "root's file\n"
    assert stat.S_ISREG(os.lstat(staged).st_mode)
    final = tmp_path / "out" / sink._object(1)
    final.symlink_to(staged)  # a link at the committed name, pointing at our staged file
    with pytest.raises(OutputConflict, match=f"refusing to replace committed output {final}"):
        sink.commit(1)
    assert os.path.islink(final) and staged.exists()


def test_an_internal_error_report_is_a_new_file_in_the_private_directory(tmp_path, monkeypatch, capsys):
    """Reports had predictable names in the shared temporary directory and were written through links."""
    import tempfile

    from nopstream import cli, exits

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    try:
        raise RuntimeError("a bug of ours")
    except RuntimeError as exc:
        assert cli._internal_error("run", exc) == exits.INTERNAL
    said = capsys.readouterr().err
    private = tmp_path / f"nopstream-{os.geteuid()}"
    (report,) = private.glob("internal-error-*.log")
    assert f"the traceback is in {report})" in said
    assert "RuntimeError: a bug of ours" in report.read_text()
    assert stat.S_IMODE(os.stat(report).st_mode) == 0o600 and stat.S_IMODE(os.stat(private).st_mode) == 0o700
