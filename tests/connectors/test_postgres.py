"""The postgres sink on a real PostgreSQL 15: prepared transactions, commits, and the rule of every start.

A sink whose process died is stood for by a new sink object after the old one's
connections are closed (what the server sees of a SIGKILLed process: its prepared
transactions stay, its open one is rolled back); one test kills a real process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from nopstream.connectors.postgres import PostgresSink
from nopstream.connectors.staged import OutputConflict, SinkName
from nopstream.errors import RestoreRefused, StartRefused
from nopstream.records import Batch, SinkStart
from tests.conftest import ROOT

NAME = SinkName("job", "main", "out", 0)


@pytest.fixture
def db(postgres_server, database):
    """A connection to the test's database, with the table `counts (word text primary key, n bigint)`."""
    conninfo = postgres_server.conninfo.replace("dbname=postgres", f"dbname={database}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE counts (word text PRIMARY KEY, n bigint)")
        conn.execute("CREATE TABLE words (word text, n bigint)")
        yield conn


def config(server, database: str, **extra) -> dict:
    base = {"port": server.port, "database": database, "user": server.user, "table": "words"}
    return {**base, "columns": ["word", "n"], **extra}


def rows(db, table: str = "words") -> Counter:
    return Counter(db.execute(f"SELECT word, n FROM {table}").fetchall())


def prepared(db) -> list[str]:
    return sorted(g for (g,) in db.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'job:%'"))


def dead(sink: PostgresSink) -> None:
    """What the server sees of a killed process: its sessions end."""
    for conn in (sink._writer, sink._control):
        if conn is not None:
            conn.close()


def records(*pairs) -> Batch:
    return Batch([{"word": w, "n": n} for w, n in pairs])


def test_an_epoch_is_invisible_until_committed_and_a_commit_is_idempotent(postgres_server, database, db):
    sink = PostgresSink(config(postgres_server, database), name=NAME)
    sink.recover(SinkStart(None))
    sink.write(records(("a", 1), ("b", 2)))
    sink.prepare(1)
    assert prepared(db) == ["job:main:out:0:words:l1:1"] and rows(db) == Counter()
    sink.write(records(("c", 3)))
    sink.prepare(2)
    sink.commit(1)
    assert rows(db) == Counter({("a", 1): 1, ("b", 2): 1})
    sink.commit(2)
    sink.commit(2)
    assert rows(db) == Counter({("a", 1): 1, ("b", 2): 1, ("c", 3): 1}) and prepared(db) == []
    marks = db.execute("SELECT sink, lineage, epoch, rows FROM nopstream_commits ORDER BY epoch").fetchall()
    assert marks == [("job:main:out:0:words", 1, 1, 2), ("job:main:out:0:words", 1, 2, 1)]


def test_a_restart_commits_what_is_durable_and_rolls_back_the_rest(postgres_server, database, db):
    sink = PostgresSink(config(postgres_server, database), name=NAME)
    sink.recover(SinkStart(None))
    sink.write(records(("a", 1)))
    sink.prepare(1)
    state = sink.snapshot()  # the manifest of epoch 1 covers it; the commit never came
    sink.write(records(("b", 2)))
    sink.prepare(2)  # prepared, but no manifest covers epoch 2
    sink.write(records(("c", 3)))  # open, never prepared
    dead(sink)
    again = PostgresSink(config(postgres_server, database), name=NAME)
    again.restore(state)
    again.recover(SinkStart(1))
    assert rows(db) == Counter({("a", 1): 1}) and prepared(db) == []
    again.write(records(("d", 4)))
    again.prepare(3)
    again.commit(3)
    assert rows(db) == Counter({("a", 1): 1, ("d", 4): 1})


def test_nothing_durable_rolls_back_everything_prepared(postgres_server, database, db):
    sink = PostgresSink(config(postgres_server, database), name=NAME)
    sink.recover(SinkStart(None))
    sink.write(records(("a", 1)))
    sink.prepare(1)
    dead(sink)
    PostgresSink(config(postgres_server, database), name=NAME).recover(SinkStart(None))
    assert rows(db) == Counter() and prepared(db) == []


def test_a_sigkilled_process_leaves_its_prepared_transaction_for_the_next_start(
    postgres_server, database, db
):
    script = textwrap.dedent(
        f"""
        import os, signal
        from nopstream.connectors.postgres import PostgresSink
        from nopstream.connectors.staged import SinkName
        from nopstream.records import SinkStart
        from nopstream.records import Batch
        sink = PostgresSink({config(postgres_server, database)!r}, name=SinkName("job", "main", "out", 0))
        sink.recover(SinkStart(None))
        sink.write(Batch([{{"word": "a", "n": 1}}]))
        sink.prepare(1)
        print(sink.snapshot(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {"PYTHONPATH": str(ROOT), "NOPSTREAM_POSTGRES_PASSWORD": postgres_server.password}
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    assert child.returncode == -9, child.stderr
    assert prepared(db) == ["job:main:out:0:words:l1:1"]
    sink = PostgresSink(config(postgres_server, database), name=NAME)
    sink.restore(eval(child.stdout))  # the snapshot the child printed (a dict literal)
    sink.recover(SinkStart(1))
    assert rows(db) == Counter({("a", 1): 1}) and prepared(db) == []


def test_upsert_keeps_the_last_row_of_a_key_and_never_waits_for_a_prepared_epoch(
    postgres_server, database, db
):
    cfg = config(postgres_server, database, table="counts", mode="upsert", keys=["word"])
    sink = PostgresSink(cfg, name=NAME)
    sink.recover(SinkStart(None))
    sink.write(records(("a", 1), ("b", 1), ("a", 2)))
    sink.prepare(1)
    sink.write(records(("a", 3)))  # the same key while epoch 1 is still prepared
    sink.prepare(2)
    assert rows(db, "counts") == Counter()
    sink.commit(1)
    assert rows(db, "counts") == Counter({("a", 2): 1, ("b", 1): 1})
    dead(sink)  # epoch 2 durable, its commit lost
    again = PostgresSink(cfg, name=NAME)
    again.restore(
        {"pending": [{"id": "job:main:out:0:2", "epoch": 2, "records": 1, "lineage": 1}], "epoch": 3}
    )
    again.recover(SinkStart(2))
    assert rows(db, "counts") == Counter({("a", 3): 1, ("b", 1): 1})
    assert db.execute("SELECT count(*) FROM nopstream_staged_rows").fetchone() == (0,)


def test_output_committed_after_the_restore_point_is_refused(postgres_server, database, db):
    sink = PostgresSink(config(postgres_server, database), name=NAME)
    sink.recover(SinkStart(None))
    sink.write(records(("a", 1)))
    sink.prepare(1)
    sink.commit(1)
    with pytest.raises(RestoreRefused) as refused:
        PostgresSink(config(postgres_server, database), name=NAME).recover(SinkStart(None))
    assert str(refused.value).startswith(
        f"sink 'out' subtask 0 already committed epoch 1 (postgresql://127.0.0.1:{postgres_server.port}/"
        f"{database} nopstream_commits job:main:out:0:words lineage 1 epoch 1), after the restore point"
        " (epoch none)"
    )
    assert rows(db) == Counter({("a", 1): 1})


def test_a_transaction_rolled_back_by_someone_else_is_an_output_conflict(postgres_server, database, db):
    sink = PostgresSink(config(postgres_server, database), name=NAME)
    sink.recover(SinkStart(None))
    sink.write(records(("a", 1)))
    sink.prepare(1)
    db.execute("ROLLBACK PREPARED 'job:main:out:0:words:l1:1'")
    with pytest.raises(
        OutputConflict, match=r"transaction job:main:out:0:words:l1:1 is neither prepared nor committed"
    ):
        sink.commit(1)


def test_a_missing_table_is_refused_in_the_servers_words(postgres_server, database, db):
    with pytest.raises(StartRefused) as refused:
        PostgresSink(config(postgres_server, database, table="nope"), name=NAME).recover(SinkStart(None))
    assert str(refused.value) == (
        f"postgres sink 'out': relation \"nope\" does not exist in postgresql://127.0.0.1:{postgres_server.port}"
        f"/{database} (create the table first)"
    )


def test_a_server_without_prepared_transactions_is_refused_with_its_hint(tmp_path, monkeypatch):
    from e2e import servers

    server = servers.start_postgres(tmp_path, prepared=0)
    try:
        with psycopg.connect(server.conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE words (word text, n bigint)")
        monkeypatch.setenv("NOPSTREAM_POSTGRES_PASSWORD", server.password)
        with pytest.raises(StartRefused) as refused:
            PostgresSink(config(server, "postgres"), name=NAME).recover(SinkStart(None))
        assert str(refused.value) == (
            f"postgres sink 'out': postgresql://127.0.0.1:{server.port}/postgres refuses prepared"
            " transactions: prepared transactions are disabled"
            " (Set max_prepared_transactions to a nonzero value.)"
        )
    finally:
        server.close()


def test_the_password_comes_from_the_mounted_secret_when_one_is_named(
    postgres_server, database, db, tmp_path, monkeypatch
):
    import nopstream.connectors.credentials as module

    monkeypatch.setattr(module, "SECRETS_DIR", str(tmp_path))
    monkeypatch.setenv("NOPSTREAM_POSTGRES_PASSWORD", "wrong")
    (tmp_path / "pg-cred").mkdir()
    (tmp_path / "pg-cred" / "password").write_text(postgres_server.password + "\n")
    sink = PostgresSink(config(postgres_server, database, secretRef="pg-cred"), name=NAME)
    sink.recover(SinkStart(None))  # connects with the mounted password
    with pytest.raises(StartRefused, match='password authentication failed for user "nopstream"'):
        PostgresSink(config(postgres_server, database), name=NAME).recover(SinkStart(None))


def test_nested_fields_reach_json_columns_as_json_in_both_modes(postgres_server, database, db):
    db.execute("CREATE TABLE docs (id text PRIMARY KEY, body jsonb)")
    db.execute("CREATE TABLE log (id text, body jsonb)")
    record = {"id": "a", "body": {"n": [1, 2], "s": "x"}}
    for table, extra in (("docs", {"mode": "upsert", "keys": ["id"]}), ("log", {})):
        sink = PostgresSink(
            config(postgres_server, database, table=table, columns=["id", "body"], **extra), name=NAME
        )
        sink.recover(SinkStart(None))
        sink.write(Batch([record]))
        sink.prepare(1)
        sink.commit(1)
        assert db.execute(f"SELECT id, body FROM {table}").fetchall() == [("a", {"n": [1, 2], "s": "x"})]


def test_sink_subtasks_starting_together_on_a_fresh_database_all_start(postgres_server, database, db):
    # CREATE TABLE IF NOT EXISTS is not safe under concurrency in PostgreSQL: two sessions can both
    # miss the table and one then fails on pg_type's unique index. Every subtask of a sink starts at once.
    sinks = [
        PostgresSink(config(postgres_server, database), name=SinkName("job", "main", "out", i))
        for i in range(8)
    ]
    barrier = threading.Barrier(len(sinks))

    def start(sink: PostgresSink) -> None:
        barrier.wait()
        sink.recover(SinkStart(None))

    with ThreadPoolExecutor(len(sinks)) as pool:
        failures = [f.exception() for f in [pool.submit(start, s) for s in sinks]]
    assert failures == [None] * len(sinks)
    for sink in sinks:
        dead(sink)


def test_long_names_make_gids_that_fit_and_still_commit(postgres_server, database, db):
    """A 40-character job, pipeline and sink id with a long table name made a gid over 200 bytes:
    every barrier failed, and the job after ten recoveries."""
    long_table = f"{'s' * 63}.{'t' * 63}"
    db.execute(f"CREATE SCHEMA {'s' * 63}")
    db.execute(f"CREATE TABLE {long_table} (word text, n bigint)")
    name = SinkName("j" * 40, "p" * 40, "s" * 40, 0)
    sink = PostgresSink(config(postgres_server, database, table=long_table), name=name)
    sink.recover(SinkStart(None))
    sink.write(records(("a", 1)))
    sink.prepare(1)
    (gid,) = [g for (g,) in db.execute("SELECT gid FROM pg_prepared_xacts")]
    assert len(gid.encode()) < 200 and gid.endswith(":l1:1") and gid.startswith("j" * 40)
    other = PostgresSink(
        config(postgres_server, database, table=long_table), name=SinkName("j" * 40, "p" * 40, "s" * 40, 1)
    )
    assert other._gid_of(1, 1) != gid  # another subtask: another gid
    sink.commit(1)
    assert rows(db, long_table) == Counter({("a", 1): 1})
    dead(sink)
    again = PostgresSink(config(postgres_server, database, table=long_table), name=name)
    again.recover(SinkStart(1))  # a restart finds its own transactions by the same gids
    assert rows(db, long_table) == Counter({("a", 1): 1})
