"""A PostgreSQL whose rows change while `nopstream chaos` reads them through `postgres-cdc`.

The job's slot is made before any change and never read: chaos copies it for each of its two runs
(`connectors.registry`), so both read the same changes. The changes are made while the failure-free
run reads its copy, and end with the job's end marker; the run under kills reads them from its own
copy, and the server is stopped and started again while it does.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.chaos import jobs

SLOT = "chaos_cdc"
END = "chaos-end"
"""The source's `endMarker`: emitted after the last change."""


def cdc_source(server: Any, database: str, *, snapshot_rows: int = 0) -> tuple[str, dict[str, Any]]:
    """`database` on `server` given `items` (`snapshot_rows` rows in it first, read by an initial
    snapshot), its publication, and the job's slot: its conninfo and the source's config (no TLS),
    which ends at the end marker."""
    from nopstream.connectors.postgres_cdc import make_slot

    conninfo = server.conninfo.replace("dbname=postgres", f"dbname={database}")
    source = {"port": server.port, "user": server.user, "database": database, "slot": SLOT}
    source |= {"publication": "chaos_items", "tables": ["items"], "endMarker": END}
    if snapshot_rows:
        source["snapshot"] = "initial"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
        conn.execute(
            "INSERT INTO items SELECT i, i %% 5, 'first ' || i FROM generate_series(1000000, %s) i",
            (1_000_000 + snapshot_rows - 1,),
        )
        conn.execute("CREATE PUBLICATION chaos_items FOR TABLE items")
        if snapshot_rows:
            make_slot(source)  # with its copy of the rows
        else:  # over the conninfo, which has the server's TLS settings
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    return conninfo, source


class LiveChanges(threading.Thread):
    """Beside a chaos run of the job: `rows` rows inserted, updated and deleted in ten paced rounds
    once the failure-free run reads its slot, then the end marker; the server restarted (3 s down)
    a seeded 1 to 3 s after the run under kills began to read, once it reads again after any kill
    then. `join` raises what went wrong."""

    def __init__(self, server: Any, conninfo: str, *, seed: int, rows: int = 3000) -> None:
        super().__init__(name="live-changes", daemon=True)
        self.server, self.conninfo, self.rows = server, conninfo, rows
        self.rng = random.Random(seed)
        self.changes = 0
        self.restarted = False  # while the run under kills read its slot
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._read_by("clean")
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                for first in range(0, self.rows, self.rows // 10):
                    self.changes += jobs.change_rows(conn, self.rng, rows=self.rows // 10, first=first)
                    time.sleep(0.3)
                conn.execute("SELECT pg_logical_emit_message(true, %s, '')", (END,))
            self._read_by("faulty")
            time.sleep(self.rng.uniform(1.0, 3.0))
            self._read_by("faulty", timeout=60)  # not between a kill and its recovery
            self.server.restart(down=3.0)
            self.restarted = True
        except BaseException as err:  # re-raised by join, in the test
            self.failure = err

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        assert not self.is_alive(), "the live changes did not end"
        if self.failure is not None:
            raise self.failure

    def _read_by(self, run: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not self._reading(run):
            assert time.monotonic() < deadline, f"chaos's {run} run read no slot in {timeout:.0f} s"
            time.sleep(0.1)

    def _reading(self, run: str) -> bool:
        """Whether a process reads the slot chaos copied for its `run` run now."""
        query = "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE %s AND active_pid IS NOT NULL"
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            return conn.execute(query, (f"{SLOT}_chaos_%_{run}",)).fetchone() == (1,)


def recovered_from_the_restart(chaos_dir: Path) -> bool:
    """Whether the run under kills recovered from its source failing on the server's restart."""
    (log,) = chaos_dir.glob("*/faulty/runner.log")
    said = [line for line in log.read_text().splitlines() if line.startswith("recovering: ")]
    return any("changes/0 failed: " in line and "server" in line for line in said)


def only_the_slot_left(conninfo: str) -> None:
    """Each run's own slot and snapshot copy were dropped once compared; drop the job's."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        assert conn.execute("SELECT slot_name FROM pg_replication_slots ORDER BY 1").fetchall() == [(SLOT,)]
        copies = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'nopstream_cdc'")
        assert {name for (name,) in copies.fetchall()} <= {SLOT}
        conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        conn.execute("DROP SCHEMA IF EXISTS nopstream_cdc CASCADE")
