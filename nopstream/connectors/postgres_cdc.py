"""The `postgres-cdc` source (REPLAYABLE): the row changes of a publication's tables, read from a
logical replication slot with the streaming replication protocol and decoded from `pgoutput`.

psycopg 3 has no replication protocol; psycopg2's `LogicalReplicationConnection` is the client
(the same libpq underneath, so TLS, SCRAM and the refusals at start are the sink's). One split:
the source's first subtask reads the slot, the others have nothing to read.

Position: the end LSN of the last whole transaction read, and how many changes of the next one
were read (a barrier may fall inside a transaction). A restored reader asks the slot for what
commits after that LSN and skips those changes. The slot is told a position is flushed only once
the epoch whose snapshot holds it is durable (`AcknowledgingSource`): the server keeps every
change a restore may ask for again, and lets go of it after.

With `endMarker` the input ends after the transaction holding the first logical decoding message of
that prefix (`pg_logical_emit_message(true, prefix, ...)`): from then on it is bounded by that
transaction's end, checkpointed as `bounded`'s end is, so every restore ends at the same change.

With `snapshot: initial` a fresh job first reads the publication's tables as they were when its
slot began (`connectors.cdc_snapshot`: a copy made with the slot's exported snapshot), each row a
change of op `read`, then the slot's changes; its position in the copy is in the checkpoint too.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extras
from psycopg import sql

from nopstream.connectors import cdc_snapshot
from nopstream.connectors.pgoutput import Begin, Change, Commit, Marker, Relation, Truncate, decode, row
from nopstream.connectors.postgres import connect, libpq_options, refusal
from nopstream.errors import RestoreRefused, StartRefused
from nopstream.model.connectors import PostgresCdcSourceConfig
from nopstream.records import Batch

KEEPALIVE_S = 10.0
"""How often an idle reader tells the server it is there (its wal_sender_timeout is 60 s by default)."""


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (`16/B374D848`)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_of(text: str) -> int:
    """An LSN written as PostgreSQL does, as a number."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


SLOT_WAIT = 10.0
"""Seconds a start waits for another reader of its slot to let go: the server lets go of a reader of
this job killed a moment ago well within it; one that holds on is another job's."""


def wait_until_unread(conn: Any, slot: str) -> None:
    """Wait up to SLOT_WAIT for `slot` to have no reader (the server ends a reader whose client went
    a moment after); StartRefused naming the reader then."""
    deadline = time.monotonic() + SLOT_WAIT
    while True:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        (pid,) = row.fetchone() or (None,)
        if pid is None:
            return
        if time.monotonic() > deadline:
            raise StartRefused(
                f"postgres-cdc: replication slot '{slot}' is being read by server process {pid} (another"
                f" job?) for longer than {SLOT_WAIT:.0f} s: a slot has one reader, give each job its own"
            )
        time.sleep(0.2)


def drop_when_unread(conn: Any, slot: str) -> None:
    """Drop `slot`, if it exists, once it has no reader (`wait_until_unread`)."""
    wait_until_unread(conn, slot)
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )


class PostgresCdcSource:
    """Reads the slot for one source subtask (the first; the others end at once)."""

    def __init__(self, config: dict[str, Any], *, subtask: int) -> None:
        """A reader of a validated `PostgresCdcSourceConfig`; the publication is checked (or created)
        now, the slot at the first read, once it is known whether the job was restored."""
        self.config = PostgresCdcSourceConfig.model_validate(config)
        self.reads = subtask == 0
        self._split = f"slot:{self.config.slot}"
        self.position: tuple[int, int] | None = None  # (end LSN of the last whole transaction, changes after)
        self.end: int | None = None
        self._skip = 0  # changes of the first transaction after a restore that were read before it
        self._seen = 0  # changes of the transaction being read
        self._begin: Begin | None = None
        self._marked = False  # the transaction being read holds the end marker
        self._ended = False  # the end was reached inside a batch: nothing more is taken
        self._relations: dict[int, Relation] = {}
        self._snapshot_lsn: int | None = None
        self._taken: list[tuple[int, int]] = []  # (epoch, LSN) of snapshots not yet durable
        self._flushed = 0
        self._connection: Any = None
        self._cursor: Any = None
        self._streaming = False
        self._copy: cdc_snapshot.Copy | None = None
        self._copied: int | None = None  # the last row of the copy read (None: the copy is read whole)
        self._copy_reader: Any = None  # a connection reading the copy, until it is dropped
        self._past_copy = False  # the last snapshot was taken after the copy was read whole
        self._copy_done_in: int | None = None  # the first epoch whose snapshot is past the copy
        self._fed = time.monotonic()
        if self.reads:
            self._publication()

    # the server's side: publication and slot

    def _publication(self) -> None:
        """StartRefused when the publication does not exist and no `tables` say what it holds."""
        c = self.config
        with connect(c) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_publication WHERE pubname = %s", (c.publication,)
            ).fetchone()
            if found is not None:
                return
            if not c.tables:
                raise StartRefused(
                    f"postgres-cdc: publication '{c.publication}' does not exist in {c.database} (create it,"
                    " or give tables to create it for)"
                )
            tables = sql.SQL(", ").join(sql.Identifier(*t.split(".")) for t in c.tables)
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(c.publication), tables)
            )

    def _slot(self) -> int:
        """The slot's confirmed position, the slot made now when it does not exist (a fresh job only;
        RestoreRefused for a restored one), and, bounded, the end of the WAL now unless restored;
        StartRefused for a slot of another plugin or database."""
        c = self.config
        query = "SELECT plugin, database, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s"
        with connect(c) as conn:
            found = conn.execute(query, (c.slot,)).fetchone()
            if found is None and self.position is not None:
                raise RestoreRefused(
                    f"postgres-cdc: replication slot '{c.slot}' is gone, and with it the changes after"
                    f" {lsn_text(self.position[0])} this job restored to (a new slot would start now)"
                )
            if c.snapshot == "initial" and (self.position is None or self._copied is not None):
                found = self._with_copy(conn, found)
            elif c.snapshot == "initial":  # restored past the copy: a kill may have come before its drop
                cdc_snapshot.drop(conn, c.slot)
            elif found is None:
                self._cursor.create_replication_slot(c.slot, output_plugin="pgoutput")
                found = conn.execute(query, (c.slot,)).fetchone()
            assert found is not None  # the slot just made
            plugin, database, confirmed = found
            if (plugin, database) != ("pgoutput", c.database):
                raise StartRefused(
                    f"postgres-cdc: replication slot '{c.slot}' decodes {database} with {plugin}, not"
                    f" {c.database} with pgoutput"
                )
            if self.config.bounded and self.end is None:
                (now,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone() or ("0/0",)
                self.end = lsn_of(now)
            wait_until_unread(conn, c.slot)
            return lsn_of(str(confirmed))

    def _with_copy(self, conn: Any, slot: Any) -> Any:
        """The row of the slot (`slot`: its row now, None when missing), made now with its copy when
        missing or cut short, and its copy to read; StartRefused for a slot made without a copy,
        RestoreRefused when the copy a restore reads in is gone."""
        c = self.config
        copy = cdc_snapshot.found(conn, c.slot)
        if self.position is not None:  # restored inside the snapshot
            if not isinstance(copy, cdc_snapshot.Copy):
                raise RestoreRefused(
                    f"postgres-cdc: the snapshot copy {cdc_snapshot.SCHEMA}.{c.slot} this job restored into"
                    " is gone (it is dropped once read: restore a later checkpoint, or start over)"
                )
        elif slot is not None and copy is None:
            raise StartRefused(
                f"postgres-cdc: replication slot '{c.slot}' has no snapshot copy"
                f" {cdc_snapshot.SCHEMA}.{c.slot} (rule: snapshot: initial reads a slot the job made with"
                " its copy; drop the slot, or say snapshot: never)"
            )
        elif slot is None or copy == "incomplete":  # a fresh start, or one a kill cut short
            if slot is not None:
                drop_when_unread(conn, c.slot)
            cdc_snapshot.begin(conn, c.slot)
            self._cursor.execute(f'CREATE_REPLICATION_SLOT "{c.slot}" LOGICAL pgoutput EXPORT_SNAPSHOT')
            _, start, snapshot, _ = self._cursor.fetchone()
            copy = cdc_snapshot.fill(c, c.slot, snapshot, lsn_of(start))
        assert isinstance(copy, cdc_snapshot.Copy)
        self._copy = copy
        if self._copied is None:
            self._copied = 0
        query = "SELECT plugin, database, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s"
        return conn.execute(query, (c.slot,)).fetchone()

    def _open(self) -> None:
        """Connect for replication and start reading the slot at the position (or the copy before)."""
        confirmed = self._connect()
        if self.position is None:
            self.position = (confirmed, 0)
        if self._copied is None:
            self._start_replication()
        else:  # the replication connection waits, idle, until the copy is read
            self._copy_reader = connect(self.config)

    def _connect(self) -> int:
        """Connect for replication; the slot's confirmed position (`_slot`)."""
        try:
            self._connection = psycopg2.connect(
                **libpq_options(self.config), connection_factory=psycopg2.extras.LogicalReplicationConnection
            )
        except psycopg2.OperationalError as err:
            refused = refusal(err, self.config)
            if refused is None:
                raise
            raise refused from None
        self._cursor = self._connection.cursor()
        return self._slot()

    def _start_replication(self) -> None:
        assert self.position is not None
        options = {"proto_version": "1", "publication_names": self.config.publication}
        if self.config.end_marker is not None:
            options["messages"] = "true"
        self._cursor.start_replication(
            slot_name=self.config.slot, decode=False, start_lsn=self.position[0], options=options
        )
        self._streaming = True

    # reading

    def read(self, max_records: int) -> Batch | None:
        """Up to `max_records` changes, each stamped with its transaction's commit time."""
        if not self.reads:
            return None
        if self._cursor is None:
            self._open()
        if self._copied is not None:
            batch = self._read_copy(max_records)
            if batch.records:
                return batch
            self._copied = None
            self._start_replication()
        if self._done():
            return None
        records: list[Any] = []
        stamps: list[int] = []
        while len(records) < max_records and not self._ended:
            message = self._next()
            if message is None:
                break
            for record in self._take(decode(message.payload)):
                assert self._begin is not None  # changes come inside a transaction
                records.append(record)
                stamps.append(self._begin.commit_ms)
        self._keep_alive(asked=not records and self.end is not None)
        return Batch(records, stamps)

    def _read_copy(self, max_records: int) -> Batch:
        """Up to `max_records` rows of the snapshot copy after the last one read (none: read whole)."""
        assert self._copy is not None and self._copied is not None
        found = cdc_snapshot.rows(self._copy_reader, self.config.slot, self._copied, max_records)
        records = [self._copy.record(table, values) for _, table, values in found]
        if found:
            self._copied = found[-1][0]
        return Batch(records, [self._copy.ms] * len(records))

    def _next(self) -> Any:
        """The next message of the stream, if one is there; StartRefused when the server cannot decode
        the slot (a publication made after changes the slot holds: no retry mends it)."""
        try:
            return self._cursor.read_message()
        except psycopg2.errors.UndefinedObject as err:
            said = str(err).splitlines()[0]
            raise StartRefused(
                f"postgres-cdc: slot '{self.config.slot}': {said} when a change the slot holds was made"
                " (create the publication before the slot, or make a new slot)"
            ) from None

    def _take(self, message: Any) -> list[dict[str, Any]]:
        """The records of one message, the position moved past it."""
        assert self.position is not None
        if isinstance(message, Relation):
            self._relations[message.oid] = message
        elif isinstance(message, Begin):
            if self.end is not None and message.final_lsn >= self.end:
                self._ended = True  # committed past the end: not read, by this reader or a restored one
            else:
                self._begin, self._seen = message, 0
        elif isinstance(message, Commit):
            self.position, self._begin, self._skip = (message.end_lsn, 0), None, 0
            if self._marked:  # the input ends after this transaction, as `bounded` ends at its end
                self.end, self._marked, self._ended = message.end_lsn, False, True
        elif isinstance(message, Marker):
            self._marked = self._marked or message.prefix == self.config.end_marker
        elif isinstance(message, Change | Truncate):
            self._seen += 1
            if self._seen > self._skip:  # the first ones of a transaction read before a restore are skipped
                self.position = (self.position[0], self._seen)
                return self._records(message)
        return []

    def _records(self, change: Change | Truncate) -> list[dict[str, Any]]:
        assert self._begin is not None
        lsn = self._begin.final_lsn
        if isinstance(change, Change) and self._relations[change.relation].schema == cdc_snapshot.SCHEMA:
            return []  # a snapshot copy being made (a publication of all tables holds it)
        if isinstance(change, Truncate):
            return [
                {
                    "op": "truncate",
                    "table": self._relations[oid].qualified,
                    "before": None,
                    "after": None,
                    "lsn": lsn,
                }
                for oid in change.relations
            ]
        relation = self._relations[change.relation]
        before = (
            None if change.before is None else row(relation, change.before, keys_only=change.before_is_key)
        )
        after = None if change.after is None else row(relation, change.after)
        if after is not None and before is not None and not change.before_is_key:
            after = {
                **before,
                **after,
            }  # an unchanged TOASTed value is left out of the new row: the old one holds
        return [{"op": change.op, "table": relation.qualified, "before": before, "after": after, "lsn": lsn}]

    def _done(self) -> bool:
        """At the end (`bounded`'s, or an end marker's): no transaction open, and the position, a transaction
        committed past it, or what the server sent is there."""
        if self.end is None or self._begin is not None:
            return False
        assert self.position is not None
        return self._ended or self.position[0] >= self.end or self._cursor.wal_end >= self.end

    def _keep_alive(self, *, asked: bool) -> None:
        """Tell the server now and then that the reader is there; `asked` asks it to say how far it
        decoded (a bounded reader waiting for its end)."""
        if asked or time.monotonic() - self._fed > KEEPALIVE_S:
            self._cursor.send_feedback(reply=asked)
            self._fed = time.monotonic()

    # checkpoints

    def snapshot(self) -> dict[str, Any]:
        """The position, as the cursor of the one split (the slot), and, bounded, the end; nothing from
        a subtask that does not read (a restore gives every subtask every split's cursor)."""
        self._snapshot_lsn = self.position[0] if self.position is not None else None
        self._past_copy = self._copy is not None and self._copied is None
        if self.position is None:
            return {}
        cursor: dict[str, int] = {"lsn": self.position[0], "skip": self.position[1]}
        if self._copied is not None:
            cursor["copied"] = self._copied
        return {"cursors": {self._split: cursor}, **({"end": self.end} if self.end is not None else {})}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume after the position of a snapshot (the reading subtask only)."""
        cursor = state.get("cursors", {}).get(self._split)
        if self.reads and cursor is not None:
            self.position = (int(cursor["lsn"]), int(cursor["skip"]))
            self._skip = self.position[1]
            self._copied = cursor.get("copied")
            self.end = state.get("end")

    def snapshotted(self, epoch: int) -> None:
        """The last `snapshot` is epoch `epoch`'s."""
        if self._snapshot_lsn is not None:
            self._taken.append((epoch, self._snapshot_lsn))
        if self._past_copy and self._copy_done_in is None:
            self._copy_done_in = epoch

    def durable(self, epoch: int) -> None:
        """Epochs up to `epoch` are durable: the slot may let go of what their snapshots read, and the
        snapshot copy goes once one of them was taken after it was read whole."""
        if self._copy_done_in is not None and epoch >= self._copy_done_in and self._copy is not None:
            cdc_snapshot.drop(self._copy_reader, self.config.slot)
            self._copy_reader.close()
            self._copy_reader = self._copy = self._copy_done_in = None
        done = [lsn for e, lsn in self._taken if e <= epoch]
        self._taken = [(e, lsn) for e, lsn in self._taken if e > epoch]
        if done and max(done) > self._flushed and self._streaming:
            self._flushed = max(done)
            self._cursor.send_feedback(write_lsn=self._flushed, flush_lsn=self._flushed, force=True)
            self._fed = time.monotonic()

    def close(self) -> None:
        """Stop reading; the slot stays, at the last durable position."""
        if self._connection is not None:
            self._connection.close()
            self._connection = self._cursor = None
            self._streaming = False
        if self._copy_reader is not None:
            self._copy_reader.close()
            self._copy_reader = None


def make_slot(config: dict[str, Any]) -> None:
    """Make the source's slot now, as a fresh job's first start would (with `snapshot: initial` its
    copy of the tables too): what commits after it is what the job reads as changes."""
    source = PostgresCdcSource(config, subtask=0)
    try:
        source._connect()
    finally:
        source.close()


def copy_slot(config: dict[str, Any], slot: str) -> None:
    """Make `slot` a copy of the source's slot (made now when it does not exist), at its position, with
    a copy of its snapshot: a run of `nopstream chaos` reads from the same place as every other."""
    c = PostgresCdcSourceConfig.model_validate(config)
    make_slot(config)
    drop_slot({**config, "slot": slot})
    with connect(c) as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (c.slot, slot))
        if c.snapshot == "initial":
            cdc_snapshot.duplicate(conn, c.slot, slot)


def drop_slot(config: dict[str, Any]) -> None:
    """Drop the source's slot and its snapshot copy, if they exist (the server lets go of the WAL kept)."""
    c = PostgresCdcSourceConfig.model_validate(config)
    with connect(c) as conn:
        drop_when_unread(conn, c.slot)
        cdc_snapshot.drop(conn, c.slot)
