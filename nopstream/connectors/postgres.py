"""The `postgres` sink (TWO_PHASE_COMMIT): one prepared transaction per sink subtask and epoch.

Transaction N holds the rows between barriers N-1 and N. At barrier N they are
written (insert: into the table; upsert: into the staging table, see below) together
with a marker row in `nopstream_commits`, and the transaction is prepared as
`PREPARE TRANSACTION '{jobId}:{pipelineId}:{operatorId}:{subtask}:{table}:l{lineage}:{N}'`
(its head and a hash when the names make it too long for the server, `gid_prefix`):
durable in the server, invisible to readers. Once epoch N is durable, `COMMIT
PREPARED` makes it visible. A gid that is no longer prepared is committed when its
marker row is visible and lost otherwise, which is refused: the marker tells a
commit that happened from a transaction that was rolled back.

Upsert writes stage their rows in `nopstream_staged_rows` (inserts only: a prepared
transaction holds no lock on the user's rows, so the next epoch's writes of the same
keys never wait for it) and the commit applies them with `INSERT ... ON CONFLICT
DO UPDATE` in one local transaction that also deletes them. The lineage is in the
gid because a new lineage of an emptied namespace numbers its epochs from 1 again; the
table is in it (and in the marker's key) so that one job's copies writing to two
tables (as `nopstream chaos` runs it) never take each other's commits for their own.

`recover` at every start (`staged.StagedSink`): commits prepared transactions up to
the restore point, applies their staged rows, and rolls back every other prepared
transaction of this subtask. It first checks, with the server's own words, that the
table and its columns exist and that the server allows prepared transactions
(`StartRefused` otherwise: no restart can fix those).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from nopstream.connectors.credentials import password, tls_paths
from nopstream.connectors.staged import OutputConflict, SinkName, StagedSink
from nopstream.errors import StartRefused
from nopstream.model.connectors import PostgresConnection, PostgresSinkConfig, PostgresTls
from nopstream.records import Batch, SinkRecovery, SinkStart

PASSWORD_ENV = "NOPSTREAM_POSTGRES_PASSWORD"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS nopstream_commits (
    sink text NOT NULL, lineage integer NOT NULL, epoch bigint NOT NULL, rows bigint NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, lineage, epoch));
CREATE TABLE IF NOT EXISTS nopstream_staged_rows (
    sink text NOT NULL, lineage integer NOT NULL, epoch bigint NOT NULL, seq bigserial, row jsonb NOT NULL,
    PRIMARY KEY (sink, lineage, epoch, seq));
"""
_SCHEMA_LOCK = 0x6E6F7073747265  # the advisory lock under which sink subtasks create the tables above


GID_PREFIX_BYTES = 150
"""The longest sink id a gid carries whole: PostgreSQL's gids are shorter than 200 bytes, and the
lineage and epoch numbers take the rest (`:l{lineage}:{epoch}`, at most 44 bytes)."""


def gid_prefix(sink_id: str) -> str:
    """The start of a sink's gids: its id, or (when that is too long) its head and a hash of all of it.

    Long job, pipeline, sink and table names made gids over PostgreSQL's 200 bytes and
    every barrier failed. A hashed prefix still names one sink (the marker rows carry
    its whole id) and is the same in every process.
    """
    if len(sink_id.encode()) <= GID_PREFIX_BYTES:
        return sink_id
    digest = hashlib.sha256(sink_id.encode()).hexdigest()[:32]
    return f"{sink_id.encode()[:100].decode(errors='ignore')}~{digest}"


class PostgresSink(StagedSink):
    """Writes a sink subtask's rows in prepared transactions, committed when their epoch is durable."""

    def __init__(self, config: dict[str, Any], *, name: SinkName) -> None:
        """A sink subtask of a validated `PostgresSinkConfig`; connections open at `recover`."""
        super().__init__(name)
        self.config = PostgresSinkConfig.model_validate(config)
        self.table = _identifier(self.config.table)
        self._rows: list[tuple[Any, ...]] = []
        self._writer: psycopg.Connection[Any] | None = None
        self._control: psycopg.Connection[Any] | None = None
        self.sink_id = f"{self.txn_prefix}:{self.config.table}"
        self._gid_prefix = gid_prefix(self.sink_id)
        self._gid = re.compile(rf"^{re.escape(self._gid_prefix)}:l(\d+):(\d+)$")

    # connections

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        # an insert that meets a row of a prepared transaction fails rather than wait forever
        return connect(
            self.config,
            autocommit=autocommit,
            options="-c lock_timeout=10s",
            application_name=f"nopstream {self.sink_id}"[:63],
        )

    @property
    def control(self) -> psycopg.Connection[Any]:
        """The autocommit connection: COMMIT/ROLLBACK PREPARED, markers, recovery."""
        if self._control is None or self._control.closed:
            self._control = self._connect(autocommit=True)
        return self._control

    @property
    def writer(self) -> psycopg.Connection[Any]:
        """The connection that holds the epoch's transaction until it is prepared."""
        if self._writer is None or self._writer.closed:
            self._writer = self._connect(autocommit=False)
        return self._writer

    def _where_server(self) -> str:
        return f"postgresql://{self.config.host}:{self.config.port}/{self.config.database}"

    def _check_server(self) -> None:
        """StartRefused, in the server's words, when the table or prepared transactions are missing."""
        with self.control.transaction():
            # CREATE TABLE IF NOT EXISTS races between sessions (pg_type's unique index): one at a time
            self.control.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            self.control.execute(_SCHEMA)
        columns = sql.SQL(", ").join(map(sql.Identifier, self.config.columns))
        try:
            self.control.execute(sql.SQL("SELECT {} FROM {} LIMIT 0").format(columns, self.table))
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as err:
            raise StartRefused(
                f"postgres sink '{self.name.operator_id}': {err.diag.message_primary} in"
                f" {self._where_server()} (create the table first)"
            ) from None
        probe = f"{self._gid_prefix}:probe"
        if self.control.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (probe,)).fetchone():
            self.control.execute(
                sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(probe))
            )  # a crash left it
        with self._connect(autocommit=False) as conn:
            try:
                conn.execute("SELECT 1")
                conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(probe)))
            except psycopg.errors.ObjectNotInPrerequisiteState as err:
                raise StartRefused(
                    f"postgres sink '{self.name.operator_id}': {self._where_server()} refuses prepared"
                    f" transactions: {err.diag.message_primary} ({err.diag.message_hint})"
                ) from None
        self.control.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(probe)))

    # writing

    def write(self, batch: Batch) -> None:
        """Add the batch's rows to the open transaction (held until the barrier)."""
        columns = self.config.columns
        for r in batch.records:
            if isinstance(r, dict):
                self._rows.append(tuple(r.get(c) for c in columns))
            elif len(columns) == 1:
                self._rows.append((r,))
            else:
                raise TypeError(
                    f"postgres sink '{self.name.operator_id}' needs mappings for {len(columns)} columns"
                )
        self.records += len(batch.records)

    def _stage(self, epoch: int) -> None:
        gid = self._gid_of(self.lineage, epoch)
        conn = self.writer
        with conn.cursor() as cur:
            if self.config.mode == "insert":
                names = sql.SQL(", ").join(map(sql.Identifier, self.config.columns))
                with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(self.table, names)) as copy:
                    for row in self._rows:
                        copy.write_row(tuple(map(_value, row)))
            else:
                cur.executemany(
                    "INSERT INTO nopstream_staged_rows (sink, lineage, epoch, row) VALUES (%s, %s, %s, %s)",
                    [
                        (self.sink_id, self.lineage, epoch, _row_json(self.config.columns, r))
                        for r in self._rows
                    ],
                )
            cur.execute(
                "INSERT INTO nopstream_commits (sink, lineage, epoch, rows) VALUES (%s, %s, %s, %s)",
                (self.sink_id, self.lineage, epoch, len(self._rows)),
            )
            cur.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))

    def prepare(self, epoch: int) -> None:
        """Barrier `epoch`: prepare the open transaction (pre-commit) and open the next."""
        super().prepare(epoch)
        self._rows = []

    def _gid_of(self, lineage: int, epoch: int) -> str:
        return f"{self._gid_prefix}:l{lineage}:{epoch}"

    # committing

    def _publish(self, epoch: int, lineage: int) -> None:
        gid = self._gid_of(lineage, epoch)
        try:
            self.control.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
        except psycopg.errors.UndefinedObject:
            if not self._marked(lineage, epoch):
                raise OutputConflict(
                    f"transaction {gid} is neither prepared nor committed in {self._where_server()}:"
                    " it was rolled back by someone else"
                ) from None
        if self.config.mode == "upsert":
            self._apply(lineage, epoch)

    def _marked(self, lineage: int, epoch: int) -> bool:
        found = self.control.execute(
            "SELECT 1 FROM nopstream_commits WHERE sink = %s AND lineage = %s AND epoch = %s",
            (self.sink_id, lineage, epoch),
        ).fetchone()
        return found is not None

    def _apply(self, lineage: int, epoch: int) -> None:
        """Upsert the committed staged rows of one epoch into the table and delete them, atomically."""
        c = self.config
        names = sql.SQL(", ").join(map(sql.Identifier, c.columns))
        fields = sql.SQL(", ").join(sql.Identifier("p", col) for col in c.columns)
        keys = sql.SQL(", ").join(map(sql.Identifier, c.keys or []))
        key_fields = sql.SQL(", ").join(sql.Identifier("p", col) for col in c.keys or [])
        rest = [col for col in c.columns if col not in (c.keys or [])]
        update = (
            sql.SQL("DO UPDATE SET ")
            + sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(col)) for col in rest)
            if rest
            else sql.SQL("DO NOTHING")
        )
        # the last row of a key in the epoch wins, as it would have row by row
        statement = sql.SQL(
            "WITH moved AS (DELETE FROM nopstream_staged_rows WHERE sink = %s AND lineage = %s AND epoch = %s"
            " RETURNING seq, row), latest AS (SELECT DISTINCT ON ({key_fields}) {fields} FROM moved m,"
            " jsonb_populate_record(NULL::{table}, m.row) p ORDER BY {key_fields}, m.seq DESC)"
            " INSERT INTO {table} ({names}) SELECT {names} FROM latest ON CONFLICT ({keys}) {update}"
        ).format(
            key_fields=key_fields, fields=fields, keys=keys, names=names, table=self.table, update=update
        )
        with self.control.transaction():
            self.control.execute(statement, (self.sink_id, lineage, epoch))

    # recovery

    def recover(self, start: SinkStart) -> SinkRecovery:
        """Check the server, then the rule of every start (`StagedSink.recover`); staged rows applied."""
        self._rows = []
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._check_server()
        recovery = super().recover(start)
        if self.config.mode == "upsert":
            for lineage, epoch in self._unapplied(start.durable or 0):
                self._apply(lineage, epoch)
        return recovery

    def _unapplied(self, durable: int) -> list[tuple[int, int]]:
        """Committed epochs up to `durable` whose staged rows were not applied yet (a crash in between)."""
        rows = self.control.execute(
            "SELECT DISTINCT s.lineage, s.epoch FROM nopstream_staged_rows s JOIN nopstream_commits c"
            " USING (sink, lineage, epoch) WHERE s.sink = %s AND s.epoch <= %s ORDER BY 1, 2",
            (self.sink_id, durable),
        ).fetchall()
        return [(int(lineage), int(epoch)) for lineage, epoch in rows]

    def _staged_txns(self) -> list[tuple[int, int]]:
        gids = self.control.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
        out = []
        for (gid,) in gids.fetchall():
            m = self._gid.match(gid)
            if m:
                out.append((int(m.group(1)), int(m.group(2))))
        return out

    def _committed_epochs(self) -> list[int]:
        rows = self.control.execute(
            "SELECT epoch FROM nopstream_commits WHERE sink = %s AND lineage = %s",
            (self.sink_id, self.lineage),
        ).fetchall()
        return [int(e) for (e,) in rows]

    def _drop(self, lineage: int, epoch: int) -> None:
        self.control.execute(
            sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(self._gid_of(lineage, epoch)))
        )

    def _where(self, epoch: int) -> str:
        return f"{self._where_server()} nopstream_commits {self.sink_id} lineage {self.lineage} epoch {epoch}"

    def finish(self) -> None:
        """End of input: the open transaction waits for the final epoch; connections stay for its commit."""


def _identifier(table: str) -> sql.Identifier:
    """`table` or `schema.table` as a quoted identifier."""
    return sql.Identifier(*table.split("."))


def _value(v: Any) -> Any:
    """A field as COPY takes it: nested values as JSON text."""
    return orjson.dumps(v).decode() if isinstance(v, dict | list) else v


def _row_json(columns: list[str], row: tuple[Any, ...]) -> str:
    return orjson.dumps(dict(zip(columns, row, strict=True))).decode()


def tls_options(tls: PostgresTls | None, secret_ref: str | None) -> dict[str, str]:
    """libpq's TLS parameters for `tls` (none without it), its files by `credentials.tls_paths`;
    StartRefused when a verifying mode has no CA."""
    if tls is None:
        return {}
    ca, cert, key = tls_paths(tls, secret_ref)
    options: dict[str, str] = {"sslmode": tls.mode}
    if ca is not None:
        options["sslrootcert"] = ca
    elif tls.mode != "require":
        where = f" or ca.crt in Secret '{secret_ref}'" if secret_ref else ""
        raise StartRefused(f"tls.mode {tls.mode} verifies the server against a CA: give tls.caFile{where}")
    if cert is not None and key is not None:
        options |= {"sslcert": cert, "sslkey": key}
    return options


REFUSING = (
    "password authentication failed",
    "pg_hba.conf",  # no entry for this client, or one that rejects it
    "certificate",  # not verified, not for this host, required, unreadable
    "SSL error:",  # a handshake that failed on what was presented (a broken chain, an unknown CA)
    "private key file",
    "does not exist",
)
"""Words of a connection failure no retry can mend (credentials, certificates, a missing database or
role): a refusal at start, unless the failure is also one of PASSING."""
PASSING = (
    "SSL SYSCALL error",  # a reset during the handshake
    "unexpected eof while reading",  # OpenSSL 3's "SSL error:" for a server gone mid-handshake
)
"""Words of a server that went away during the connection (down or restarting): retried."""


def libpq_options(c: PostgresConnection) -> dict[str, Any]:
    """libpq's parameters of the connection: server, database, user, password
    (`credentials.password`) and TLS (`tls_options`)."""
    return {
        "host": c.host,
        "port": c.port,
        "dbname": c.database,
        "user": c.user,
        "password": password(c.secret_ref, PASSWORD_ENV),
        "connect_timeout": 10,
        **tls_options(c.tls, c.secret_ref),
    }


def connect(
    config: PostgresConnection | dict[str, Any], *, autocommit: bool = True, **extra: Any
) -> psycopg.Connection[Any]:
    """A connection to the database of `config` (a sink's when plain data); StartRefused, in the
    server's words on one line, for a failure in `REFUSING`."""
    c = config if isinstance(config, PostgresConnection) else PostgresSinkConfig.model_validate(config)
    try:
        return psycopg.connect(**libpq_options(c), autocommit=autocommit, **extra)
    except psycopg.OperationalError as err:
        refused = refusal(err, c)
        if refused is None:
            raise
        raise refused from None


def refusal(err: Exception, c: PostgresConnection) -> StartRefused | None:
    """The refusal a connection failure is, in the server's words, one line; None when a retry may mend it."""
    said = " ".join(str(err).split())
    if not any(words in said for words in REFUSING) or any(words in said for words in PASSING):
        return None
    return StartRefused(f"postgresql://{c.host}:{c.port}/{c.database} refused user {c.user}: {said}")


def create_like(config: dict[str, Any], table: str) -> None:
    """Create `table` empty, with the columns, defaults and keys of the sink's table (`nopstream chaos`)."""
    source = _identifier(PostgresSinkConfig.model_validate(config).table)
    with connect(config) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(sql.Identifier(table), source))


def table_records(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every row of the sink's table, as a record of its configured columns."""
    c = PostgresSinkConfig.model_validate(config)
    names = sql.SQL(", ").join(map(sql.Identifier, c.columns))
    with connect(config) as conn:
        found = conn.execute(sql.SQL("SELECT {} FROM {}").format(names, _identifier(c.table)))
        return [dict(zip(c.columns, row, strict=True)) for row in found.fetchall()]


def drop_table(config: dict[str, Any]) -> None:
    """Drop the sink's table and forget its commits (`nopstream chaos`, after a run compared equal)."""
    c = PostgresSinkConfig.model_validate(config)
    with connect(config) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_identifier(c.table)))
        suffix = f":{c.table}"  # a sink id ends with its table
        conn.execute("DELETE FROM nopstream_commits WHERE right(sink, %s) = %s", (len(suffix), suffix))


_PARAMETER = re.compile(r"%\((\w+)\)s")


class PostgresLookup:
    """A query with the record's fields as parameters; its first row by column name."""

    def __init__(self, spec: dict[str, Any], capacity: int) -> None:
        """Read the query and the connection settings; the pool holds `capacity` connections."""
        self.spec = spec
        self.query: str = spec["query"]
        self.parameters = _PARAMETER.findall(self.query)
        self.capacity = capacity
        self._pool: asyncio.Future[Any] | None = None

    def key(self, record: Any) -> tuple[Any, ...]:
        """The query's parameter values of `record`."""
        return tuple(record[name] for name in self.parameters)

    async def fetch(self, key: tuple[Any, ...]) -> Any:
        """The first row of the query for these parameter values, or None."""
        if self._pool is None:  # opened once, on the task's loop, by the first call; the others wait
            self._pool = asyncio.ensure_future(self._open())
        pool = await self._pool
        async with pool.connection() as conn:
            cursor = await conn.execute(self.query, dict(zip(self.parameters, key, strict=True)))
            return await cursor.fetchone()

    async def _open(self) -> Any:
        from psycopg_pool import AsyncConnectionPool  # imported by the jobs that look things up

        s = self.spec
        server = {k: s[k] for k in ("host", "port", "database", "user", "secretRef", "tls") if k in s}
        c = PostgresConnection.model_validate(server)
        conninfo = libpq_options(c)
        try:  # once, so that a refusal says so instead of the pool retrying it until its timeout
            await (await psycopg.AsyncConnection.connect(**conninfo)).close()
        except psycopg.OperationalError as err:
            refused = refusal(err, c)
            if refused is None:
                raise
            raise refused from None
        pool = AsyncConnectionPool(
            kwargs={**conninfo, "autocommit": True, "row_factory": dict_row},
            min_size=1,
            max_size=self.capacity,
            open=False,
        )
        await pool.open(wait=True, timeout=30)
        return pool

    async def close(self) -> None:
        """Close the pool, if a call opened one: its workers stop before the task's loop ends (left
        to the loop's end, a worker whose connection attempt took the cancellation as a failure
        waits on for work, and the process never exits)."""
        if self._pool is None:
            return
        if not self._pool.done():
            self._pool.cancel()
        await asyncio.wait([self._pool])  # an open that failed has failed the task already
        if not self._pool.cancelled() and self._pool.exception() is None:
            await self._pool.result().close()
