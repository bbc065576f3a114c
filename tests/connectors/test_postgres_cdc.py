"""The postgres-cdc source on a real PostgreSQL 15 (wal_level=logical): the exact changes of a
publication's tables, a restore inside a transaction, the slot told only what is durable, whole
jobs under kills exact, and refusals at start."""

from __future__ import annotations

import json
import time
from collections import Counter

import orjson
import psycopg
import pytest

from nopstream.connectors.postgres_cdc import PostgresCdcSource, drop_when_unread, lsn_of
from nopstream.errors import RestoreRefused, StartRefused


@pytest.fixture
def db(postgres_server, database):
    """A connection to the test's database, with `items` (REPLICA IDENTITY FULL) and `tags` (default)."""
    conninfo = postgres_server.conninfo.replace("dbname=postgres", f"dbname={database}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8,2), ok boolean, doc jsonb,"
            " weight double precision)"
        )
        conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE tags (id int PRIMARY KEY, tag text)")
        yield conn
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
        ).fetchall():
            drop_when_unread(conn, slot)  # a source closed a moment ago may still have its server reader


def config(server, database: str, **extra) -> dict:
    base = {"port": server.port, "database": database, "user": server.user, "slot": f"s_{database[-6:]}"}
    return {**base, "publication": "changes", "tables": ["items", "public.tags"], **extra}


def read_all(source: PostgresCdcSource, count: int, *, batch: int = 100, timeout: float = 30) -> list:
    """Read until `count` records came (failing after `timeout`)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} changes after {timeout} s: {got}"
        b = source.read(min(batch, count - len(got)))
        assert b is not None
        got += b.records
    return got


def without_lsn(records: list) -> list:
    return [{k: v for k, v in r.items() if k != "lsn"} for r in records]


def test_inserts_updates_deletes_and_truncates_come_with_their_images(postgres_server, database, db):
    source = PostgresCdcSource(config(postgres_server, database), subtask=0)
    assert source.read(10).records == []  # the slot is made at the first read: what commits after it comes
    with db.transaction():
        db.execute("INSERT INTO items VALUES (1, 'a', 2.50, true, '{\"k\": [1]}', 0.5)")
        db.execute("INSERT INTO items VALUES (2, 'b', NULL, false, NULL, 1)")
        db.execute("INSERT INTO tags VALUES (7, 'red')")
    db.execute("UPDATE items SET name = 'A', price = 3 WHERE id = 1")
    db.execute("UPDATE tags SET tag = 'blue' WHERE id = 7")
    db.execute("DELETE FROM items WHERE id = 2")
    db.execute("DELETE FROM tags WHERE id = 7")
    db.execute("TRUNCATE tags")
    got = read_all(source, 8)
    one = {"id": 1, "name": "a", "price": "2.50", "ok": True, "doc": {"k": [1]}, "weight": 0.5}
    two = {"id": 2, "name": "b", "price": None, "ok": False, "doc": None, "weight": 1.0}
    assert without_lsn(got) == [
        {"op": "insert", "table": "public.items", "before": None, "after": one},
        {"op": "insert", "table": "public.items", "before": None, "after": two},
        {"op": "insert", "table": "public.tags", "before": None, "after": {"id": 7, "tag": "red"}},
        {
            "op": "update",
            "table": "public.items",
            "before": one,
            "after": {**one, "name": "A", "price": "3.00"},
        },
        # REPLICA IDENTITY DEFAULT: no old row for an update, the key only for a delete
        {"op": "update", "table": "public.tags", "before": None, "after": {"id": 7, "tag": "blue"}},
        {"op": "delete", "table": "public.items", "before": two, "after": None},
        {"op": "delete", "table": "public.tags", "before": {"id": 7}, "after": None},
        {"op": "truncate", "table": "public.tags", "before": None, "after": None},
    ]
    lsns = [r["lsn"] for r in got]
    assert lsns[0] == lsns[1] == lsns[2] < lsns[3] < lsns[4] < lsns[5] < lsns[6] < lsns[7]  # commit LSNs
    source.close()


def test_a_restore_inside_a_transaction_reads_each_change_once_and_the_slot_keeps_what_is_not_durable(
    postgres_server, database, db
):
    first = PostgresCdcSource(config(postgres_server, database), subtask=0)
    first.read(1)
    db.execute("INSERT INTO items (id) SELECT generate_series(1, 5)")  # one transaction of 5 changes
    db.execute("INSERT INTO items (id) VALUES (6)")
    got = read_all(first, 2)
    state = orjson.loads(orjson.dumps(first.snapshot()))
    first.snapshotted(1)
    slot = "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s"
    name = config(postgres_server, database)["slot"]
    (created,) = db.execute(slot, (name,)).fetchone()
    cursor = state["cursors"][f"slot:{name}"]
    assert cursor == {"lsn": lsn_of(created), "skip": 2}  # inside the first transaction
    got += read_all(first, 2)  # read on, but not in the snapshot: gone with this reader
    first.close()
    second = PostgresCdcSource(config(postgres_server, database), subtask=0)
    second.restore(state)
    rest = read_all(second, 4)
    assert [r["after"]["id"] for r in got[:2] + rest] == [1, 2, 3, 4, 5, 6]
    position = second.position
    second.snapshot()
    second.snapshotted(2)
    # nothing durable yet: the slot still holds both transactions (psycopg2 may confirm on its own
    # what the server decoded before sending anything, never a commit it sent)
    (held,) = db.execute(slot, (name,)).fetchone()
    assert lsn_of(held) <= got[0]["lsn"]
    second.durable(2)
    deadline = time.monotonic() + 10
    while db.execute(slot, (name,)).fetchone()[0] == held and time.monotonic() < deadline:
        second.read(1)
        time.sleep(0.05)
    (flushed,) = db.execute(slot, (name,)).fetchone()
    # the snapshot held the first transaction whole and one change of the second, whose commit had not
    # been read: the slot let go of the first only
    assert position == (lsn_of(flushed), 1)
    assert got[0]["lsn"] < lsn_of(flushed) < rest[-1]["lsn"]
    second.close()


def _copies(db) -> list[str]:
    """The snapshot copies in the test's database."""
    found = db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'nopstream_cdc' ORDER BY 1")
    return [name for (name,) in found.fetchall()]


def test_an_end_marker_ends_the_input_after_its_transaction_and_a_restore_before_it_ends_there_too(
    postgres_server, database, db
):
    """`endMarker`: the changes up to the end of the transaction holding the first transactional
    message of that prefix, none after; messages of other prefixes and outside a transaction pass;
    a reader restored before the marker ends at the same change, one restored past it at once."""
    settings = config(postgres_server, database, endMarker="the-end")
    first = PostgresCdcSource(settings, subtask=0)
    first.read(1)  # makes the slot
    db.execute("INSERT INTO tags VALUES (1, 'a')")
    db.execute("SELECT pg_logical_emit_message(false, 'the-end', 'not in a transaction')")
    with db.transaction():
        db.execute("INSERT INTO tags VALUES (2, 'b')")
        db.execute("SELECT pg_logical_emit_message(true, 'the-end-not', '')")
    got = read_all(first, 2)
    state = orjson.loads(orjson.dumps(first.snapshot()))  # before the marker
    with db.transaction():
        db.execute("INSERT INTO tags VALUES (3, 'c')")
        db.execute("SELECT pg_logical_emit_message(true, 'the-end', '')")
        db.execute("INSERT INTO tags VALUES (4, 'd')")  # in the marker's transaction: read
    db.execute("INSERT INTO tags VALUES (5, 'e')")  # after it: never read
    got += read_all(first, 2)
    deadline = time.monotonic() + 10
    while (batch := first.read(10)) is not None:
        assert batch.records == [] and time.monotonic() < deadline
    assert [r["after"]["id"] for r in got] == [1, 2, 3, 4]
    ended = orjson.loads(orjson.dumps(first.snapshot()))
    first.close()
    assert ended["end"] == ended["cursors"][f"slot:{settings['slot']}"]["lsn"]

    again = PostgresCdcSource(settings, subtask=0)
    again.restore(state)
    rest = read_all(again, 2)
    while (batch := again.read(10)) is not None:
        assert batch.records == []
    assert without_lsn(rest) == without_lsn(got[2:])
    again.close()
    past = PostgresCdcSource(settings, subtask=0)
    past.restore(ended)
    assert past.read(10) is None
    past.close()
    with pytest.raises(ValueError, match="bounded and endMarker are two ends: give one"):
        PostgresCdcSource({**settings, "bounded": True}, subtask=0)


def test_an_initial_snapshot_reads_the_tables_as_the_slot_began_then_the_changes_after_it(
    postgres_server, database, db
):
    """`snapshot: initial`: each row as it was when the slot was made (op `read`, typed as changes are),
    a restore inside the copy reads the rest once, then the changes committed after the slot began; the
    copy is dropped once an epoch past it is durable. A publication of all tables holds the copy too:
    its rows being written are not changes."""
    db.execute(
        "INSERT INTO items SELECT i, 'n' || i, i * 1.5, i % 2 = 0, jsonb_build_object('i', i), i / 4.0"
        " FROM generate_series(1, 250) i"
    )
    db.execute("INSERT INTO tags VALUES (1, 'a'), (2, NULL), (3, 'c')")
    db.execute("CREATE PUBLICATION everything FOR ALL TABLES")
    settings = {**config(postgres_server, database, publication="everything"), "snapshot": "initial"}
    del settings["tables"]
    slot = settings["slot"]
    first = PostgresCdcSource(settings, subtask=0)
    got = first.read(100).records  # makes the slot and its copy, then reads the copy
    assert _copies(db) == [slot]
    db.execute("UPDATE items SET name = 'changed' WHERE id = 1")  # after the slot began: changes
    db.execute("DELETE FROM items WHERE id = 2")
    db.execute("INSERT INTO tags VALUES (4, 'd')")
    state = orjson.loads(orjson.dumps(first.snapshot()))
    assert state["cursors"][f"slot:{slot}"]["copied"] == 100
    first.read(50)  # read on, but not in the snapshot: gone with this reader
    first.close()
    second = PostgresCdcSource(settings, subtask=0)
    second.restore(state)
    rest = read_all(second, 153 + 3)
    copied, changes = got + rest[:153], rest[153:]
    assert {r["op"] for r in copied} == {"read"} and all(r["before"] is None for r in copied)
    by_table = Counter(r["table"] for r in copied)
    assert by_table == {"public.items": 250, "public.tags": 3}
    assert sorted(r["after"]["id"] for r in copied if r["table"] == "public.items") == list(range(1, 251))
    one = next(r["after"] for r in copied if r["table"] == "public.items" and r["after"]["id"] == 1)
    assert one == {"id": 1, "name": "n1", "price": "1.50", "ok": False, "doc": {"i": 1}, "weight": 0.25}
    assert {r["after"]["id"]: r["after"]["tag"] for r in copied if r["table"] == "public.tags"} == {
        1: "a",
        2: None,
        3: "c",
    }
    assert [(r["op"], r["table"]) for r in changes] == [
        ("update", "public.items"),
        ("delete", "public.items"),
        ("insert", "public.tags"),
    ]
    assert changes[0]["before"] == one  # a change's image and a copied row read alike
    assert changes[0]["after"] == {**one, "name": "changed"}
    state = second.snapshot()
    assert "copied" not in state["cursors"][f"slot:{slot}"]
    second.snapshotted(2)
    assert _copies(db) == [slot]  # until the epoch past the copy is durable
    second.durable(2)
    assert _copies(db) == []
    db.execute("INSERT INTO tags VALUES (5, 'e')")
    assert [r["after"] for r in read_all(second, 1)] == [{"id": 5, "tag": "e"}]
    second.close()


def test_a_snapshot_a_kill_cut_short_is_made_again_and_a_slot_without_one_is_refused(
    postgres_server, database, db
):
    """A copy left incomplete (the job died between making its slot and committing the copy) is the
    job's own: its slot is made again and the tables read whole. A slot made by someone else has no
    copy, and a restore inside a copy that was dropped cannot go on: both are refused in one line."""
    from nopstream.connectors import cdc_snapshot
    from nopstream.connectors.postgres_cdc import make_slot

    db.execute("INSERT INTO tags SELECT i, 't' || i FROM generate_series(1, 30) i")
    settings = {**config(postgres_server, database), "snapshot": "initial"}
    slot = settings["slot"]
    cdc_snapshot.begin(db, slot)
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("INSERT INTO tags VALUES (31, 'after the first slot')")  # in the new snapshot
    source = PostgresCdcSource(settings, subtask=0)
    got = read_all(source, 31)
    assert sorted(r["after"]["id"] for r in got) == list(range(1, 32))
    assert source.read(10).records == []
    state = source.snapshot()
    source.close()

    other = {**settings, "slot": "made_elsewhere"}
    db.execute("SELECT pg_create_logical_replication_slot('made_elsewhere', 'pgoutput')")
    with pytest.raises(StartRefused) as refused:
        make_slot(other)
    assert str(refused.value) == (
        "postgres-cdc: replication slot 'made_elsewhere' has no snapshot copy nopstream_cdc.made_elsewhere"
        " (rule: snapshot: initial reads a slot the job made with its copy; drop the slot, or say snapshot:"
        " never)"
    )
    cdc_snapshot.drop(db, slot)
    restored = PostgresCdcSource(settings, subtask=0)
    restored.restore({"cursors": {f"slot:{slot}": {**state["cursors"][f"slot:{slot}"], "copied": 12}}})
    with pytest.raises(RestoreRefused) as gone:
        restored.read(10)
    assert str(gone.value) == (
        f"postgres-cdc: the snapshot copy nopstream_cdc.{slot} this job restored into is gone (it is dropped"
        " once read: restore a later checkpoint, or start over)"
    )
    restored.close()


def test_a_snapshot_job_run_twice_at_once_is_refused_and_run_again_once_finished_adds_nothing(
    tmp_path, postgres_server, database, db
):
    """`snapshot: initial`, bounded: a second run started while the first copies is refused naming the
    holder; the first reads every row once and drops its copy when its final epoch is committed; run
    again once finished, it restores that epoch, writes nothing more and makes no new copy."""
    from tests.chaos import jobs
    from tests.checkpointing.test_faults import committed, run_job, start_job

    db.execute("INSERT INTO tags SELECT i, 't' || i FROM generate_series(1, 1500) i")
    source = {**config(postgres_server, database), "snapshot": "initial"}
    workdir = tmp_path / "job"
    model = jobs.postgres_cdc(source, {"type": "file", "config": {"path": "per-row"}})
    # one epoch only, the final one: the source hears of its commit, and drops the copy, before it ends
    jobs.prepare(workdir, {**model, "checkpoint": {"intervalMs": 600_000}})
    first = start_job(workdir, env=postgres_server.env)  # paced: 2 ms a row, 3 s in all
    try:
        slots = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s"
        wait_for(lambda: db.execute(slots, (source["slot"],)).fetchone() == (1,), "the job's slot")
        second = run_job(workdir, env=postgres_server.env)
        _, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0, err
    assert second.returncode == 1, second.stderr
    assert "job 'pg-cdc' cannot run: checkpoint namespace 'pg-cdc/main' in " in second.stderr
    assert " is held by " in second.stderr and "Traceback" not in second.stderr
    rows = Counter(json.dumps({"id": i, "tag": f"t{i}"}, sort_keys=True) for i in range(1, 1501))
    every = committed(workdir, "out")
    assert Counter(json.dumps(json.loads(c)["after"], sort_keys=True) for c in every.elements()) == rows
    assert {json.loads(c)["op"] for c in every} == {"read"} and max(every.values()) == 1
    assert _copies(db) == [], err[-3000:]
    again = run_job(workdir, env=postgres_server.env)
    assert again.returncode == 0, again.stderr
    assert committed(workdir, "out") == every and _copies(db) == []


def test_a_publication_made_after_the_changes_its_slot_holds_is_refused(postgres_server, database, db):
    """pgoutput reads each change with the catalog as it was then: a publication made later is not
    there for it. The server says so for every try; the source refuses to start, in one line."""
    slot = config(postgres_server, database)["slot"]
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("INSERT INTO items (id) VALUES (1)")
    source = PostgresCdcSource(config(postgres_server, database), subtask=0)  # makes it
    deadline = time.monotonic() + 10
    with pytest.raises(StartRefused) as refused:
        while time.monotonic() < deadline:
            source.read(10)
    assert str(refused.value) == (
        f"postgres-cdc: slot '{slot}': publication \"changes\" does not exist when a change the slot holds"
        " was made (create the publication before the slot, or make a new slot)"
    )
    source.close()


def test_a_source_without_its_publication_or_slot_is_refused(postgres_server, database, db):
    bare = {k: v for k, v in config(postgres_server, database).items() if k != "tables"}
    with pytest.raises(StartRefused, match=f"publication 'changes' does not exist in {database}"):
        PostgresCdcSource(bare, subtask=0)
    source = PostgresCdcSource(config(postgres_server, database, slot="gone"), subtask=0)
    source.restore({"cursors": {"slot:gone": {"lsn": 1 << 24, "skip": 0}}})
    with pytest.raises(
        RestoreRefused, match="replication slot 'gone' is gone, and with it the changes after 0/1000000"
    ):
        source.read(1)
    wrong = {**config(postgres_server, database), "user": "nobody"}
    refused = r'refused user nobody: .* password authentication failed for user "nobody"'
    with pytest.raises(StartRefused, match=refused):
        PostgresCdcSource(wrong, subtask=0)


def test_a_slot_another_reader_holds_is_refused_and_one_let_go_of_is_read(
    postgres_server, database, db, monkeypatch
):
    """A second job on the slot of a running one is refused at start naming the reader; a reader that
    lets go within the wait (a task killed a moment ago) is waited for."""
    import threading

    from nopstream.connectors import postgres_cdc

    monkeypatch.setattr(postgres_cdc, "SLOT_WAIT", 1.0)
    first = PostgresCdcSource(config(postgres_server, database), subtask=0)
    assert first.read(10) is not None  # it made the slot and reads it
    db.execute("INSERT INTO items (id) VALUES (1)")
    assert [r["op"] for r in read_all(first, 1)] == ["insert"]
    (pid,) = db.execute(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
        (config(postgres_server, database)["slot"],),
    ).fetchone()
    second = PostgresCdcSource(config(postgres_server, database), subtask=0)
    slot = config(postgres_server, database)["slot"]
    with pytest.raises(StartRefused) as refused:
        second.read(10)
    assert str(refused.value) == (
        f"postgres-cdc: replication slot '{slot}' is being read by server process {pid} (another job?) for"
        " longer than 1 s: a slot has one reader, give each job its own"
    )
    second.close()
    monkeypatch.setattr(postgres_cdc, "SLOT_WAIT", 10.0)
    threading.Timer(1.0, first.close).start()  # lets go while the third waits
    third = PostgresCdcSource(config(postgres_server, database), subtask=0)
    third.restore(first.snapshot())
    db.execute("INSERT INTO items (id) VALUES (2)")
    assert [r["after"]["id"] for r in read_all(third, 1)] == [2]
    third.close()


def test_subtasks_after_the_first_have_nothing_to_read_and_keep_no_position(postgres_server, database, db):
    other = PostgresCdcSource(config(postgres_server, database), subtask=1)
    assert other.read(10) is None
    # a restore gives every subtask every cursor: one that does not read must not write it back (a
    # checkpoint joins the subtasks' states, and an old position would win)
    other.restore({"cursors": {f"slot:{config(postgres_server, database)['slot']}": {"lsn": 5, "skip": 1}}})
    assert other.snapshot() == {}


def test_changes_made_while_the_job_runs_and_a_server_restart_are_read_exactly_once(tmp_path):
    """The test changes rows while the job reads them, stops the server for 3 s in the middle (the
    replication connection breaks; the job recovers from its last durable epoch and reads the slot
    from there), changes more, and stops the job at a savepoint once it committed every change.
    Every change is in out/ once, and per-row/ counts each row's changes 1..n."""
    import random

    from e2e import servers
    from tests.chaos import jobs
    from tests.checkpointing.test_faults import committed, start_job
    from tests.conftest import run_nopstream

    own = servers.start_postgres(tmp_path / "own")
    try:
        with psycopg.connect(own.conninfo, autocommit=True) as conn:
            conn.execute("CREATE DATABASE cdc")
        conninfo = own.conninfo.replace("dbname=postgres", "dbname=cdc")
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
        workdir = tmp_path / "job"
        source = {"port": own.port, "user": own.user, "database": "cdc", "slot": "live"}
        source |= {"publication": "items_changes", "tables": ["items"]}
        per_row = {"type": "file", "config": {"path": "per-row"}}
        jobs.prepare(workdir, jobs.postgres_cdc(source, per_row, bounded=False))
        run = start_job(workdir, env=own.env)
        made = 0
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:  # it reads what commits after its slot
                slots = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'live'"
                wait_for(lambda: conn.execute(slots).fetchone() == (1,), "the job's slot")
            rng = random.Random(9)
            with psycopg.connect(conninfo, autocommit=True) as conn:
                made += jobs.change_rows(conn, rng, rows=600)
            own.restart(down=3.0)
            with psycopg.connect(conninfo, autocommit=True) as conn:
                made += jobs.change_rows(conn, rng, rows=600, first=600)
            wait_for(lambda: sum(committed(workdir, "out").values()) >= made, "all committed", 120)
            asked = run_nopstream("savepoint", "job.yaml", "--stop", cwd=workdir)
            assert asked.code == 0, asked.err
            _, err = run.communicate(timeout=60)
        finally:
            run.kill()
        assert run.returncode == 0, err
        assert "recovering: " in err, err  # the restart broke the replication connection
        every, per_row = committed(workdir, "out"), committed(workdir, "per-row")
        assert sum(every.values()) == made and max(every.values()) == 1
        changes_per_row = Counter(jobs.row_key_of(json.loads(change)) for change in every)
        assert per_row == Counter(
            json.dumps({"key": key, "value": n}, sort_keys=True)
            for key, count in changes_per_row.items()
            for n in range(1, count + 1)
        )
    finally:
        own.close()


def wait_for(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s"
        time.sleep(0.1)


CDC_FNS = """
def row(change):
    # a change as a version of its row: a delete is the version "no tier"
    after = change["after"]
    if after is None:
        return {"customer": change["before"]["id"], "tier": None}
    return {"customer": after["id"], "tier": after["tier"]}

def with_tier(order, version):
    return {"order": order["id"], "tier": version["tier"] if version is not None else None}
"""


def test_a_temporal_join_takes_its_versioned_table_from_change_data_capture(
    tmp_path, postgres_server, database, db
):
    """Tier changes committed in four transactions 300 ms apart become the versions of a temporal
    join: each order, stamped between two commits, gets the tier its customer had then (none before
    the first insert and after the delete)."""
    from tests.checkpointing.test_faults import committed, prepare, run_job

    db.execute("CREATE TABLE tiers (id int PRIMARY KEY, tier text)")
    db.execute("ALTER TABLE tiers REPLICA IDENTITY FULL")
    db.execute("CREATE PUBLICATION tier_changes FOR TABLE tiers")
    slot = f"t_{database[-6:]}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    steps = [
        ["INSERT INTO tiers VALUES (1, 'bronze'), (2, 'bronze'), (3, 'silver')"],
        ["UPDATE tiers SET tier = 'gold' WHERE id = 1"],
        ["DELETE FROM tiers WHERE id = 2"],
        ["UPDATE tiers SET tier = 'gold' WHERE id = 3", "INSERT INTO tiers VALUES (4, 'bronze')"],
    ]
    tables = [{}, {1: "bronze", 2: "bronze", 3: "silver"}]
    tables += [{**tables[1], 1: "gold"}, {1: "gold", 3: "silver"}, {1: "gold", 3: "gold", 4: "bronze"}]
    gaps = [int(time.time() * 1000) - 200]  # an instant before each commit and after the one before
    for statements in steps:
        time.sleep(0.3)
        with db.transaction():
            for statement in statements:
                db.execute(statement)
        time.sleep(0.3)
        gaps.append(int(time.time() * 1000) - 150)
    orders = [{"id": f"o{g}-{c}", "customer": c, "ts": ts} for g, ts in enumerate(gaps) for c in (1, 2, 3, 4)]
    model = {
        "jobId": "cdc-temporal",
        "checkpoint": {"intervalMs": 150},
        "model": {
            "sources": [
                {
                    "id": "orders",
                    "type": "file",
                    "config": {"path": "in/*.jsonl", "format": "jsonl"},
                    "watermark": {"timestampField": "ts"},
                },
                {
                    "id": "changes",
                    "type": "postgres-cdc",
                    "config": {
                        **config(postgres_server, database, slot=slot),
                        "publication": "tier_changes",
                        "tables": ["tiers"],
                        "bounded": True,
                    },
                    "watermark": {},
                },
            ],
            "operators": [
                {"id": "versions", "type": "map", "inputs": ["changes"], "fn": "cdcfns:row"},
                {
                    "id": "with-tier",
                    "type": "join",
                    "inputs": ["orders", "versions"],
                    "key": {"field": "customer"},
                    "join": {"kind": "temporal", "how": "left"},
                    "fn": "cdcfns:with_tier",
                },
            ],
            "sinks": [{"id": "out", "type": "file", "inputs": ["with-tier"], "config": {"path": "out"}}],
        },
    }
    prepare(tmp_path / "job", model, {"orders.jsonl": "".join(json.dumps(o) + "\n" for o in orders)})
    (tmp_path / "job" / "cdcfns.py").write_text(CDC_FNS)
    result = run_job(tmp_path / "job", env=postgres_server.env)
    assert result.returncode == 0, result.stderr
    assert committed(tmp_path / "job", "out") == Counter(
        json.dumps({"order": o["id"], "tier": tables[g].get(o["customer"])}, sort_keys=True)
        for g, o in ((int(o["id"][1 : o["id"].index("-")]), o) for o in orders)
    )
