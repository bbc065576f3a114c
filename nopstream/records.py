"""Records and what the task asks of source readers and sink writers; `nopstream.connectors` implements it.

Neutral ground between the runtime and its siblings, which DESIGN.md keeps
independent of each other: `Batch` (what a reader returns and a writer takes), the
protocols, and `TaskSnapshot` (what a task hands to checkpointing at a barrier and
gets back at a restore). It imports nothing but the plan.

The runtime depends on these protocols only; the runner passes a `ConnectorFactory`
that builds the reader or writer of a node's connector type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from nopstream.plan.partitioned import SourceSplits
from nopstream.plan.streamgraph import StreamNode

MIN_TIMESTAMP = -(2**63)
MAX_TIMESTAMP = 2**63 - 1


@dataclass(slots=True)
class Batch:
    """Records in channel order, with their event timestamps when the job has event time.

    `marks`, with timestamps, holds for each record the watermark its own source split
    had reached just before it was read: an operator judges a record late against it
    (`late_reference`), so what is late depends on the data only (docs/time.md). Records
    made by timers and windows carry none: the operator's watermark judges them.
    """

    records: list[Any]
    timestamps: list[int] | None = None
    marks: list[int] | None = None

    def pick(self, positions: list[int]) -> Batch:
        """The records at `positions`, in that order, with their timestamps and marks."""
        records, stamps, marks = self.records, self.timestamps, self.marks
        return Batch(
            [records[i] for i in positions],
            None if stamps is None else [stamps[i] for i in positions],
            None if marks is None else [marks[i] for i in positions],
        )

    def cut(self, start: int, stop: int) -> Batch:
        """The records from `start` to `stop`, with their timestamps and marks."""
        stamps, marks = self.timestamps, self.marks
        return Batch(
            self.records[start:stop],
            None if stamps is None else stamps[start:stop],
            None if marks is None else marks[start:stop],
        )

    def spread(self, produced: list[list[Any]]) -> Batch:
        """The records `produced[i]` made from record i, each with record i's timestamp and mark."""
        out = Batch([r for rs in produced for r in rs])
        if self.timestamps is not None:
            out.timestamps = [t for t, rs in zip(self.timestamps, produced, strict=True) for _ in rs]
        if self.marks is not None:
            out.marks = [m for m, rs in zip(self.marks, produced, strict=True) for _ in rs]
        return out


def late_reference(marks: list[int] | None, i: int, watermark: int) -> int:
    """The event time record `i` of a batch is judged late against: its mark, or `watermark` when
    that is further (only after a split went idle, or for a split found while the job runs)."""
    return watermark if marks is None or marks[i] < watermark else marks[i]


@dataclass(frozen=True)
class Unreadable:
    """In a batch of a source with `onError: dead-letter`, in place of a record it could not read: the
    raw text (undecodable bytes replaced) and why, naming the split and where in it."""

    text: str
    reason: str


@dataclass(frozen=True)
class TaskSnapshot:
    """A task's state at a barrier: each chained operator's, its source's, and its progress through time.

    Operator and source states belong to their operators and readers (opaque here, but
    for two parts checkpointing files apart: an operator's `keyed` state by shard, and
    a sink operator's `sink` with its `pending` transactions).
    """

    operators: dict[str, dict[str, Any]]
    source: dict[str, Any] | None = None
    watermarks: dict[str, Any] | None = None
    """The input channels' watermarks (`runtime.watermarks.InputWatermarks`)."""
    source_watermark: dict[str, Any] | None = None
    """The source's watermark generator (`runtime.watermarks.WatermarkGenerator`)."""
    data_ended: bool = False
    """Whether the operators flushed at end of data already (never twice)."""
    read_size: int | None = None
    """A source task's adapted read size at the barrier: a restored source starts there."""

    def progress(self) -> dict[str, Any]:
        """The task's progress through time as one JSON object (one segment)."""
        out: dict[str, Any] = {}
        if self.watermarks is not None:
            out["watermarks"] = self.watermarks
        if self.source_watermark is not None:
            out["sourceWatermark"] = self.source_watermark
        if self.data_ended:
            out["dataEnded"] = True
        if self.read_size is not None:
            out["readSize"] = self.read_size
        return out

    def with_progress(self, progress: dict[str, Any]) -> TaskSnapshot:
        """This snapshot with the progress read back from `progress()`'s object."""
        return replace(
            self,
            watermarks=progress.get("watermarks"),
            source_watermark=progress.get("sourceWatermark"),
            data_ended=bool(progress.get("dataEnded", False)),
            read_size=progress.get("readSize"),
        )

    def pending_transactions(self) -> list[PendingTxn]:
        """The pending transactions of every sink operator, in operator order."""
        return [
            txn for op in self.operators.values() for txn in SinkState.from_json(op.get("sink", {})).pending
        ]


_SUMMARY = ("id", "epoch", "records", "lineage")


@dataclass(frozen=True)
class PendingTxn:
    """A sink's pre-committed transaction: in the checkpoint until an epoch covering it is durable, then
    published under its lineage's names. `staged` is what the sink keeps of it beyond its summary (an
    outbox: its records)."""

    id: str
    epoch: int
    records: int
    lineage: int = 1
    staged: Mapping[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The transaction as a manifest lists it (its contents stay in its segment)."""
        return {"id": self.id, "epoch": self.epoch, "records": self.records, "lineage": self.lineage}

    def to_json(self) -> dict[str, Any]:
        """The payload of its segment."""
        return {**self.summary(), **self.staged}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> PendingTxn:
        """From `to_json()`'s object (a checkpoint older than lineages holds lineage 1's)."""
        staged = {k: v for k, v in body.items() if k not in _SUMMARY}
        lineage = int(body.get("lineage", 1))
        return cls(str(body["id"]), int(body["epoch"]), int(body.get("records", 0)), lineage, staged)


@dataclass(frozen=True)
class SinkState:
    """A sink writer's snapshot: its pending transactions (a segment each) and the rest of its state."""

    pending: tuple[PendingTxn, ...] = ()
    rest: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The snapshot as a writer hands it over and takes it back."""
        return {**self.rest, "pending": [txn.to_json() for txn in self.pending]}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> SinkState:
        """From `to_json()`'s object (a writer with no transactions may hand over none)."""
        pending = tuple(PendingTxn.from_json(txn) for txn in body.get("pending", []))
        return cls(pending, {k: v for k, v in body.items() if k != "pending"})


class SourceReader(Protocol):
    """Reads the splits assigned to one source subtask, batch by batch."""

    def read(self, max_records: int) -> Batch | None:
        """Up to `max_records` records; an empty batch when none are ready; None when finished."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """Split cursors (exclusive: the next record to read) and enumerator state."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from a snapshot."""
        ...

    def close(self) -> None:
        """Release files and connections."""
        ...


@runtime_checkable
class AcknowledgingSource(Protocol):
    """A reader whose origin keeps what it was not told is safe to let go (a replication slot): it
    learns which epoch each snapshot is, and which epochs are durable."""

    def snapshotted(self, epoch: int) -> None:
        """The last `snapshot` taken is epoch `epoch`'s."""
        ...

    def durable(self, epoch: int) -> None:
        """Epochs up to `epoch` are durable: what their snapshots read will never be asked for again."""
        ...


@runtime_checkable
class SplitEventTime(Protocol):
    """A reader that keeps the event time of each of its splits (file stripes, Kafka partitions)."""

    def split_highs(self, timestamps: list[int]) -> list[int]:
        """The last batch read had these timestamps: for each record, the highest timestamp read before
        it in its own split (MIN_TIMESTAMP for a split's first), and each split's high advances."""
        ...

    def event_time_floor(self) -> int | None:
        """The lowest high over the splits that may still give records and are not idle (MIN_TIMESTAMP
        while one has none yet or is not begun); None when no split holds event time back."""
        ...


@dataclass(frozen=True)
class SinkStart:
    """What a sink learns at the start of every run, before any record flows.

    `durable`: the epoch the run restored (None: nothing is durable yet); `lineage`:
    the namespace's lineage (committed output is named by it).
    """

    durable: int | None
    lineage: int = 1


@dataclass(frozen=True)
class SinkRecovery:
    """What a sink's recovery at a start did: transactions of the durable epoch it published
    (re-committed: a crash came before their commit) and staged ones it aborted."""

    recommitted: int = 0
    aborted: int = 0

    def __add__(self, other: SinkRecovery) -> SinkRecovery:
        return SinkRecovery(self.recommitted + other.recommitted, self.aborted + other.aborted)


class SinkWriter(Protocol):
    """Writes the batches that reach one sink subtask."""

    def write(self, batch: Batch) -> None:
        """Write a batch (into the open transaction)."""
        ...

    def prepare(self, epoch: int) -> None:
        """Barrier `epoch`: pre-commit the open transaction and open the next one."""
        ...

    def commit(self, upto: int) -> None:
        """Epoch `upto` is durable: publish every pending transaction up to it (idempotent)."""
        ...

    def recover(self, start: SinkStart) -> SinkRecovery:
        """Start of a run: commit pending transactions <= durable, abort everything staged later.

        Everything staged is aborted when nothing is durable. RestoreRefused when this
        sink already committed output of an epoch after `durable` in the same lineage
        (the manifest of that epoch is gone).
        """
        ...

    def snapshot(self) -> dict[str, Any]:
        """The sink's state at a barrier."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from a snapshot."""
        ...

    def finish(self) -> None:
        """End of input: release resources (what is pending waits for its commit)."""
        ...


class LookupClient(Protocol):
    """The client of a built-in lookup (`type: lookup`): what a record's result depends on, and the
    call that fetches it."""

    def key(self, record: Any) -> Any:
        """The values the record's result depends on (hashable: the cache's key)."""
        ...

    async def fetch(self, key: Any) -> Any:
        """The result for `key` (None when there is none); raises when the call fails."""
        ...

    async def close(self) -> None:
        """Release its connections, on the task's loop before it ends (the task is over)."""
        ...


class ConnectorFactory(Protocol):
    """Builds source readers, sink writers and lookup clients by connector type."""

    def source(
        self, node: StreamNode, splits: SourceSplits, *, subtask: int, parallelism: int
    ) -> SourceReader:
        """The reader of one source subtask."""
        ...

    def sink(self, node: StreamNode, *, subtask: int, parallelism: int) -> SinkWriter:
        """The writer of one sink subtask."""
        ...

    def lookup(self, node: StreamNode, *, capacity: int) -> LookupClient:
        """The client of a lookup operator's subtask, for up to `capacity` calls at once."""
        ...
