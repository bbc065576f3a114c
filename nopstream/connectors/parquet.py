"""Parquet objects for the file and s3 connectors (pyarrow): a source of row groups, and a sink format.

Source (REPLAYABLE): every object is a Parquet file; its row groups are its splits,
row group k of an object owned by subtask `(stableHash(name) + k) mod parallelism`
(the stripes' rule, `connectors.stripes`), so the subtasks share the work whatever the
number and the sizes of the objects, and ownership depends on nothing but the name.
A subtask reads its row groups in name and group order, in batches of exactly
`max_records` rows within a group, so batch boundaries (and watermarks) are the same
on every run. Cursor: the next row of the group being read (`{name}#{group}`). A row
group is a split with its own event time (`SplitEventTime`), and the subtask's watermark
is held at the minimum until it has begun its last group. `snapshot` holds the cursor,
the groups read to their end per subtask, and the identity of each object begun;
`restore` takes every subtask's (of any parallelism). Values: `parquet_values`.
WARNING: an object being read must not change; a restore whose begun object is gone or
another under the same name is refused naming the split. An object that is not a
Parquet file, or a row group that cannot be read, is refused naming it, or, with
`onError: dead-letter`, is one unreadable record (written by the owner of its group).

Sink: each transaction is one Parquet file of `parquet.schema`, rows buffered into row
groups of `rowGroupRows` and the footer written when the transaction is staged.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nopstream.connectors import stripes
from nopstream.connectors.event_time import SplitHighs
from nopstream.connectors.parquet_values import ParquetSchema, records_of
from nopstream.connectors.striped import Discovery, Objects
from nopstream.errors import BadInput, RestoreRefused
from nopstream.model.formats import ParquetWriteOptions
from nopstream.plan.keys import stable_hash
from nopstream.records import MIN_TIMESTAMP, Batch, Unreadable

_RULE = "rule: a source of format parquet reads Parquet files"
_UNREADABLE = (pa.ArrowException, OSError)  # pyarrow's errors of a damaged file


class ParquetSource:
    """Reads one source subtask's row groups of a set of Parquet objects."""

    def __init__(
        self,
        objects: Objects,
        *,
        columns: list[str] | None,
        subtask: int,
        parallelism: int,
        discovery_ms: int | None = None,
        keep_unreadable: bool = False,
    ) -> None:
        """Discover the objects (again every `discovery_ms`, and then never end); read `columns` (all
        without); with `keep_unreadable` a damaged object or group is an `Unreadable`, not a refusal."""
        self.objects = objects
        self.columns = columns
        self.subtask = subtask
        self.parallelism = parallelism
        self.keep_unreadable = keep_unreadable
        self.done: dict[str, set[int]] = {}  # object -> this subtask's row groups read to their end
        self.cursors: dict[str, int] = {}  # split id -> its next row (the group being read)
        self.identities: dict[str, Any] = {}  # object -> its identity when begun
        self.event_times: SplitHighs[str] = SplitHighs()
        self.discovery = Discovery(objects, discovery_ms)
        self._file: pq.ParquetFile | None = None
        self._name = ""
        self._groups: list[int] = []  # this subtask's groups of the open object still to read
        self._split = ""  # the group being read
        self._table: pa.Table | None = None  # its rows
        self._row = 0  # its next row

    def _mine(self, name: str, group: int) -> bool:
        return stripes.owner(stable_hash(name), group, self.parallelism) == self.subtask

    def read(self, max_records: int) -> Batch | None:
        """Up to `max_records` rows of the row group being read."""
        while True:
            if self._file is None:
                name = self.discovery.next()
                if name is None:
                    return self.discovery.none_now()
                unreadable = self._open(name)
                if unreadable is not None:
                    return unreadable
                continue
            if self._table is None:
                if not self._groups:
                    self._close_current()
                    continue
                unreadable = self._begin(self._groups.pop(0))
                if unreadable is not None:
                    return unreadable
            table = self._table
            assert table is not None
            records: list[Any] = records_of(table.slice(self._row, max_records))
            self.event_times.start()
            self.event_times.note(self._split, len(records))
            self._row += len(records)
            if self._row < table.num_rows:
                self.cursors[self._split] = self._row
            else:
                self._end_group()
            if records:
                return Batch(records)

    def _open(self, name: str) -> Batch | None:
        """Open an object and list this subtask's unread row groups in it; a batch of one unreadable
        record when it is not Parquet (and this subtask speaks for it), None otherwise."""
        handle = self.objects.open(name, self.identities.get(name))
        try:
            parquet = pq.ParquetFile(handle)
        except _UNREADABLE as err:
            handle.close()
            return self._unreadable(name, 0, f"object '{name}' is not a Parquet file ({err})")
        self._file, self._name = parquet, name
        missing = sorted(set(self.columns or ()) - set(parquet.schema_arrow.names))
        if missing:
            raise BadInput(
                f"object '{name}' has no column {', '.join(missing)} (rule: parquet.columns names columns"
                " every object has)"
            )
        done = self.done.get(name, set())
        groups = range(parquet.metadata.num_row_groups)
        self._groups = [g for g in groups if self._mine(name, g) and g not in done]
        return None

    def _begin(self, group: int) -> Batch | None:
        """Read a row group into memory, from its cursor; a batch of one unreadable record when it
        cannot be read, None otherwise."""
        assert self._file is not None
        split = stripes.split_id(self._name, group)
        try:
            table = self._file.read_row_group(group, columns=self.columns)
        except _UNREADABLE as err:
            return self._unreadable(self._name, group, f"split '{split}' cannot be read ({err})")
        self._split, self._table, self._row = split, table, self.cursors.get(split, 0)
        return None

    def _unreadable(self, name: str, group: int, reason: str) -> Batch | None:
        """A damaged object or group: refused, or one unreadable record from the group's owner."""
        if not self.keep_unreadable:
            raise BadInput(f"{reason} ({_RULE})")
        self.done.setdefault(name, set()).add(group)
        if not self._mine(name, group):
            return None
        return Batch([Unreadable(stripes.split_id(name, group), f"{reason} ({_RULE})")])

    def _end_group(self) -> None:
        """Every row of the group was handed out."""
        self.done.setdefault(self._name, set()).add(stripes.parse_split_id(self._split)[1])
        self.cursors.pop(self._split, None)
        self._table = None

    def _close_current(self) -> None:
        self._file = None  # closing its reader closes the handle
        self._table = None
        self._groups = []

    def split_highs(self, timestamps: list[int]) -> list[int]:
        """Each record's row group high before it (`SplitEventTime`)."""
        times = self.event_times
        highs = times.highs_before(timestamps)
        if len(times.highs) > 1:  # the groups read to their end hold no event time back any more
            times.highs = {k: t for k, t in times.highs.items() if k in self.cursors or k == self._split}
        return highs

    def event_time_floor(self) -> int | None:
        """The group being read's high once it is this subtask's last (MIN_TIMESTAMP before: a group not
        begun may hold any timestamp); None when none is being read (`SplitEventTime`)."""
        if self.discovery.queue or self._groups:
            return MIN_TIMESTAMP
        if self._table is None:
            return None
        return self.event_times.highs.get(self._split, MIN_TIMESTAMP)

    def snapshot(self) -> dict[str, Any]:
        """The cursor of the group being read, the groups done, and the identities of the objects begun."""
        begun = {stripes.parse_split_id(split)[0] for split in self.cursors}
        for name in begun - self.identities.keys():
            self.identities[name] = self.objects.identity(name)
        return {
            "rowGroups": True,
            "cursors": dict(self.cursors),
            "eventTimes": {k: t for k, t in self.event_times.highs.items() if k in self.cursors},
            # keyed by subtask: a restore joins every subtask's snapshot, and each names its own groups
            "done": {str(self.subtask): {p: sorted(gs) for p, gs in sorted(self.done.items()) if gs}},
            self.objects.identity_field: {p: i for p, i in self.identities.items() if p in begun},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Resume this subtask's row groups from the snapshots of every subtask (of any parallelism);
        RestoreRefused when a begun group's object changed, or the checkpoint read the objects as lines."""
        if "rowGroups" not in state and state.get("cursors"):
            raise RestoreRefused(
                "the source's checkpoint read its objects as lines; this source reads Parquet: start over"
                " with --fresh"
            )
        self._close_current()
        done, begun = stripes.joined_progress(state)
        self.done = {p: {g for g in gs if self._mine(p, g)} for p, gs in done.items()}
        self.cursors = {
            stripes.split_id(p, g): row
            for (p, g), row in begun.items()
            if self._mine(p, g) and g not in done.get(p, ())
        }
        times = state.get("eventTimes", {})
        self.event_times.highs = {k: int(times[k]) for k in self.cursors if k in times}
        self.identities = dict(state.get(self.objects.identity_field, {}))
        for split in self.cursors:
            name = stripes.parse_split_id(split)[0]
            self.objects.check(split, name, None, self.identities.get(name))
        self.discovery.again()

    def close(self) -> None:
        """Let go of the open object."""
        self._close_current()


class ParquetFormat:
    """Transactions as Parquet files of a schema (`ObjectFormat`)."""

    ext = "parquet"

    def __init__(self, options: ParquetWriteOptions) -> None:
        """Files of `options.schema`, compressed and cut into row groups as the options say."""
        self.schema = ParquetSchema(options.columns())
        self.compression = options.compression
        self.row_group_rows = options.row_group_rows

    def writer(self) -> ParquetObjectWriter:
        """The writer of a new file."""
        return ParquetObjectWriter(self)

    def records(self, data: bytes) -> list[Any]:
        """The records of a whole Parquet file."""
        return records_of(pq.read_table(pa.BufferReader(data)))


class _Drain:
    """What pyarrow writes, kept until taken; its position counts every byte ever written."""

    closed = False

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._written = 0

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        return self._written

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        """Nothing: the bytes wait in memory to be taken."""

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        """The bytes written since the last take."""
        out, self._parts = b"".join(self._parts), []
        return out


class ParquetObjectWriter:
    """One Parquet file as it is written (`ObjectWriter`): rows wait until they fill a row group."""

    def __init__(self, fmt: ParquetFormat) -> None:
        """A file of `fmt` with nothing written yet."""
        self.format = fmt
        self._drain = _Drain()
        compression = None if fmt.compression == "none" else fmt.compression
        self._writer = pq.ParquetWriter(
            pa.PythonFile(self._drain, mode="w"), fmt.schema.arrow, compression=compression
        )
        self._held: list[pa.Table] = []
        self._rows = 0

    def add(self, records: list[Any]) -> bytes:
        """The bytes of the row groups `records` fill (none until one is full); BadRecord, with nothing
        held, for a record the schema does not fit."""
        self._held.append(self.format.schema.table(records))
        self._rows += len(records)
        if self._rows >= self.format.row_group_rows:
            full = self._rows - self._rows % self.format.row_group_rows
            table = pa.concat_tables(self._held)
            self._writer.write_table(table.slice(0, full), row_group_size=self.format.row_group_rows)
            rest = table.slice(full)
            self._held, self._rows = ([rest] if rest.num_rows else []), rest.num_rows
        return self._drain.take()

    def end(self) -> bytes:
        """The rows held, as the last row group, and the footer."""
        if self._rows:
            self._writer.write_table(pa.concat_tables(self._held), row_group_size=self.format.row_group_rows)
        self._writer.close()
        return self._drain.take()
