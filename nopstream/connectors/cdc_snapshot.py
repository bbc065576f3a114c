"""The initial snapshot of a `postgres-cdc` source (`snapshot: initial`): the publication's tables as
they were when the slot began, kept in a copy table that every read of the snapshot reads.

PostgreSQL cannot show a table as it was at an LSN once the transaction that saw it is gone, and a
kill ends it. So the slot is made with an exported snapshot, and one transaction that imports it
copies each table of the publication into `nopstream_cdc.<slot>` (each row its column values as text,
as pgoutput sends them) and marks the copy complete in the table's comment (its LSN, its time, its
tables' columns). Every read of the snapshot, after any kill or restore, reads the same rows in the
same order (`n`); the changes after the slot's start come from the slot. A copy left incomplete is
an attempt of the job's own that a kill cut short: its slot is made again. The source drops its copy
once the epoch that read past it is durable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
from psycopg import sql

from nopstream.connectors.pgoutput import Column, Relation, row
from nopstream.connectors.postgres import connect
from nopstream.model.connectors import PostgresCdcSourceConfig

SCHEMA = "nopstream_cdc"
"""The schema of the copy tables; its tables' own changes are never a source's records."""


@dataclass(frozen=True)
class Copy:
    """A complete copy: the slot's start, the snapshot's time (the event time of its rows), its tables."""

    lsn: int
    ms: int
    tables: dict[str, Relation]

    def to_comment(self) -> str:
        tables = {name: [[c.name, c.type_oid] for c in r.columns] for name, r in self.tables.items()}
        return orjson.dumps({"lsn": self.lsn, "ms": self.ms, "tables": tables}).decode()

    @classmethod
    def from_comment(cls, text: str) -> Copy:
        data = orjson.loads(text)
        tables = {}
        for name, columns in data["tables"].items():
            schema, _, table = name.partition(".")
            tables[name] = _relation(schema, table, columns)
        return cls(int(data["lsn"]), int(data["ms"]), tables)

    def record(self, table: str, values: list[str | None]) -> dict[str, Any]:
        """A copied row as the source emits it: op `read`, the row as of the slot's start."""
        after = row(self.tables[table], tuple(values))
        return {"op": "read", "table": table, "before": None, "after": after, "lsn": self.lsn}


def _relation(schema: str, name: str, columns: list[tuple[str, int]]) -> Relation:
    """A copied table, as the records of its rows are decoded: its columns' names and type OIDs."""
    return Relation(0, schema, name, tuple(Column(c, oid, False) for c, oid in columns))


def _mark(conn: Any, slot: str, copy: Copy) -> None:
    """Mark the slot's copy complete (its comment says what it holds)."""
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(_table(slot), sql.Literal(copy.to_comment())))


def _table(slot: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(slot))


def found(conn: Any, slot: str) -> Copy | str | None:
    """The slot's complete copy; "incomplete" for one a kill cut short; None when there is none."""
    comment = conn.execute(
        "SELECT obj_description(c.oid, 'pg_class') FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (SCHEMA, slot),
    ).fetchone()
    if comment is None:
        return None
    return "incomplete" if comment[0] is None else Copy.from_comment(comment[0])


def begin(conn: Any, slot: str) -> None:
    """An empty, incomplete copy table for `slot` (made before the slot: a kill after it leaves a mark)."""
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_table(slot)))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tab text NOT NULL,"
            " vals text[] NOT NULL)"
        ).format(_table(slot))
    )


def fill(config: PostgresCdcSourceConfig, slot: str, snapshot: str, lsn: int) -> Copy:
    """Copy the publication's tables as the exported `snapshot` (of the slot starting at `lsn`) sees
    them, and mark the copy complete, in one transaction."""
    with connect(config, autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        names = conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s"
            " AND schemaname <> %s ORDER BY 1, 2",
            (config.publication, SCHEMA),
        ).fetchall()
        tables = {}
        for schema, name in names:
            columns = conn.execute(
                "SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = %s::regclass"
                " AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                (sql.Identifier(schema, name).as_string(conn),),
            ).fetchall()
            relation = _relation(schema, name, columns)
            tables[relation.qualified] = relation
            values = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c, _ in columns)
            conn.execute(
                sql.SQL("INSERT INTO {} (tab, vals) SELECT %s, ARRAY[{}]::text[] FROM {}").format(
                    _table(slot), values, sql.Identifier(schema, name)
                ),
                (relation.qualified,),
            )
        copy = Copy(lsn, int(time.time() * 1000), tables)
        _mark(conn, slot, copy)
    return copy


def rows(conn: Any, slot: str, after: int, limit: int) -> list[tuple[int, str, list[str | None]]]:
    """Up to `limit` copied rows after row `after`, in order: (n, table, values)."""
    query = sql.SQL("SELECT n, tab, vals FROM {} WHERE n > %s ORDER BY n LIMIT %s").format(_table(slot))
    found: list[tuple[int, str, list[str | None]]] = conn.execute(query, (after, limit)).fetchall()
    return found


def duplicate(conn: Any, slot: str, into: str) -> None:
    """Make `into`'s copy the same as `slot`'s (a run of `nopstream chaos` reads the same snapshot)."""
    begin(conn, into)
    conn.execute(
        sql.SQL("INSERT INTO {} OVERRIDING SYSTEM VALUE SELECT n, tab, vals FROM {}").format(
            _table(into), _table(slot)
        )
    )
    copy = found(conn, slot)
    assert isinstance(copy, Copy), f"the copy of slot {slot} is not complete"
    _mark(conn, into, copy)


def drop(conn: Any, slot: str) -> None:
    """Drop the slot's copy, if there is one."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_table(slot)))
