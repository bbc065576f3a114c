"""Messages of PostgreSQL's built-in logical decoding plugin `pgoutput`, protocol version 1 (the
"Logical Replication Message Formats" chapter of PostgreSQL's documentation): decoded into typed
records, column values from their text form into JSON values by their type.

Version 1 sends each transaction whole after it committed (Begin, its changes, Commit), which is
what a position "after the transaction ending at LSN x" needs. No library decodes it well-kept
(pypgoutput was last released in 2022); the format is small and stable since PostgreSQL 10.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Literal

import orjson

POSTGRES_EPOCH_MS = 946_684_800_000
"""2000-01-01 in Unix milliseconds: the zero of the timestamps pgoutput sends (microseconds)."""


@dataclass(frozen=True)
class Column:
    """A column of a relation: its name, its type's OID, whether it is part of the replica identity."""

    name: str
    type_oid: int
    key: bool


@dataclass(frozen=True)
class Relation:
    """A table as pgoutput describes it before its first change in a session."""

    oid: int
    schema: str
    name: str
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> str:
        """`schema.name`."""
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class Begin:
    """A transaction starts: its commit LSN and time (Unix ms)."""

    final_lsn: int
    commit_ms: int
    xid: int


@dataclass(frozen=True)
class Commit:
    """A transaction ends; `end_lsn` is where the next one begins (a position after it)."""

    commit_lsn: int
    end_lsn: int
    commit_ms: int


Row = dict[str, Any]
UNCHANGED = object()
"""A TOASTed value the update did not change and pgoutput did not send."""


@dataclass(frozen=True)
class Change:
    """An insert, update or delete of one row: the old row as the table's replica identity gives it
    (None when it gives none; its key columns only when `before_is_key`), the new one (None for a
    delete)."""

    op: Literal["insert", "update", "delete"]
    relation: int
    before: tuple[Any, ...] | None
    after: tuple[Any, ...] | None
    before_is_key: bool = False


@dataclass(frozen=True)
class Truncate:
    """A TRUNCATE of published tables (no row-level change says what it removed)."""

    relations: tuple[int, ...]


@dataclass(frozen=True)
class Marker:
    """A logical decoding message inside a transaction (`pg_logical_emit_message(true, prefix, ...)`),
    as pgoutput sends it when asked for `messages`: its prefix."""

    prefix: str


Message = Relation | Begin | Commit | Change | Truncate | Marker | None


class Reader:
    """Reads the fields of one message in order."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        value = self.data[self.at : end].decode("utf-8")
        self.at = end + 1
        return value

    def tuple(self) -> tuple[Any, ...]:
        """TupleData: each column's text, None for NULL, UNCHANGED for an unchanged TOASTed value."""
        values: list[Any] = []
        for _ in range(self.take("!h")):
            kind = self.take("!c")
            if kind == b"n":
                values.append(None)
            elif kind == b"u":
                values.append(UNCHANGED)
            else:  # b"t" text (b"b" binary is not asked for)
                size = self.take("!i")
                values.append(self.data[self.at : self.at + size].decode("utf-8"))
                self.at += size
        return tuple(values)


def _ms(postgres_micros: int) -> int:
    return POSTGRES_EPOCH_MS + postgres_micros // 1000


def decode(data: bytes) -> Message:
    """One pgoutput message; None for those a change stream does not need (origin, type, a logical
    message outside a transaction)."""
    r = Reader(data)
    tag = r.take("!c")
    if tag == b"B":
        return Begin(r.take("!Q"), _ms(r.take("!q")), r.take("!I"))
    if tag == b"C":
        r.take("!b")  # flags, unused
        return Commit(r.take("!Q"), r.take("!Q"), _ms(r.take("!q")))
    if tag == b"R":
        oid, schema, name = r.take("!I"), r.string(), r.string()
        r.take("!b")  # replica identity setting
        columns = []
        for _ in range(r.take("!h")):
            flags, column, type_oid = r.take("!b"), r.string(), r.take("!I")
            r.take("!i")  # type modifier
            columns.append(Column(column, type_oid, bool(flags & 1)))
        return Relation(oid, schema, name, tuple(columns))
    if tag == b"I":
        oid = r.take("!I")
        r.take("!c")  # b"N"
        return Change("insert", oid, None, r.tuple())
    if tag == b"U":
        oid, kind = r.take("!I"), r.take("!c")
        before = None
        if kind in (b"K", b"O"):  # the old key, or the old row (REPLICA IDENTITY FULL)
            before = r.tuple()
            r.take("!c")  # b"N"
        return Change("update", oid, before, r.tuple(), before_is_key=kind == b"K")
    if tag == b"D":
        oid, kind = r.take("!I"), r.take("!c")
        return Change("delete", oid, r.tuple(), None, before_is_key=kind == b"K")
    if tag == b"T":
        count = r.take("!i")
        r.take("!b")  # options: CASCADE, RESTART IDENTITY
        return Truncate(tuple(r.take("!I") for _ in range(count)))
    if tag == b"M":
        transactional, _, prefix = r.take("!b"), r.take("!Q"), r.string()
        return Marker(prefix) if transactional & 1 else None  # one outside a transaction has no place
    return None


def _value(text: str, type_oid: int) -> Any:
    """A column's text as a JSON value: booleans, integers, floats and JSON by their type, the rest
    (numeric, dates, times, text, arrays, ...) as PostgreSQL writes them."""
    if type_oid == 16:  # bool
        return text == "t"
    if type_oid in (20, 21, 23, 26):  # int8, int2, int4, oid
        return int(text)
    if type_oid in (700, 701):  # float4, float8
        return float(text)
    if type_oid in (114, 3802):  # json, jsonb
        return orjson.loads(text)
    return text


def row(relation: Relation, values: tuple[Any, ...], *, keys_only: bool = False) -> Row:
    """The row as a mapping of column to JSON value; a replica-identity key tuple gives its key
    columns only; an unchanged TOASTed value is left out."""
    out: Row = {}
    for column, value in zip(relation.columns, values, strict=True):
        if value is UNCHANGED or (keys_only and not column.key):
            continue
        out[column.name] = None if value is None else _value(value, column.type_oid)
    return out
