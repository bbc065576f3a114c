"""The postgres-cdc source on a real PostgreSQL 15 (wal_level=logical): the exact changes of a
publication's tables, a restore inside a transaction, the slot told only what is durable, whole
jobs under kills exact, and refusals at start."""

from __future__ import annotations

import time

import orjson
import psycopg
import pytest

from nopstream.connectors.postgres_cdc import PostgresCdcSource, lsn_of
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
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


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
    source = PostgresCdcSource(config(postgres_server, database), subtask=0, parallelism=1)
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
    first = PostgresCdcSource(config(postgres_server, database), subtask=0, parallelism=1)
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
    second = PostgresCdcSource(config(postgres_server, database), subtask=0, parallelism=1)
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


def test_a_source_without_its_publication_or_slot_is_refused(postgres_server, database, db):
    bare = {k: v for k, v in config(postgres_server, database).items() if k != "tables"}
    with pytest.raises(StartRefused, match=f"publication 'changes' does not exist in {database}"):
        PostgresCdcSource(bare, subtask=0, parallelism=1)
    source = PostgresCdcSource(config(postgres_server, database, slot="gone"), subtask=0, parallelism=1)
    source.restore({"cursors": {"slot:gone": {"lsn": 1 << 24, "skip": 0}}})
    with pytest.raises(
        RestoreRefused, match="replication slot 'gone' is gone, and with it the changes after 0/1000000"
    ):
        source.read(1)
    wrong = {**config(postgres_server, database), "user": "nobody"}
    refused = r'refused user nobody: .* password authentication failed for user "nobody"'
    with pytest.raises(StartRefused, match=refused):
        PostgresCdcSource(wrong, subtask=0, parallelism=1)


def test_subtasks_after_the_first_have_nothing_to_read_and_keep_no_position(postgres_server, database, db):
    other = PostgresCdcSource(config(postgres_server, database), subtask=1, parallelism=2)
    assert other.read(10) is None
    # a restore gives every subtask every cursor: one that does not read must not write it back (a
    # checkpoint joins the subtasks' states, and an old position would win)
    other.restore({"cursors": {f"slot:{config(postgres_server, database)['slot']}": {"lsn": 5, "skip": 1}}})
    assert other.snapshot() == {}
