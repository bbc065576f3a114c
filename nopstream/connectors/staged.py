"""Transaction bookkeeping shared by the committing sinks (STAGED_ATOMIC_COMMIT).

Transaction N holds the records between barriers N-1 and N; its id is
`{jobId}:{pipelineId}:{operatorId}:{subtask}:{N}`, never random. At barrier N a sink
stages it durably (`_stage`) and it becomes pending; committing epoch M publishes
every pending transaction <= M (`_publish`, idempotent). Staged and committed
objects are named `{jobId}.{pipelineId}.l{lineage}.{operatorId}.{subtask}.{N:010d}.{ext}`:
the job and its lineage are in every name, so jobs sharing an output location, and
the lineages of one job, never write over each other.

Every start of a run calls `recover` before any record flows (the one rule for every
start): it refuses when this sink already committed output newer than the restore
point (a later manifest is missing), publishes the restored pending transactions up
to the durable epoch, and drops everything this sink subtask staged after it (all of
it when nothing is durable, and whatever an earlier lineage left). A transaction is
then created fresh, never appended to what a dead run staged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from nopstream import faults
from nopstream.connectors.lines import BadRecord
from nopstream.connectors.object_format import ObjectFormat, ObjectWriter
from nopstream.errors import BadInput, RestoreRefused
from nopstream.records import PendingTxn, SinkRecovery, SinkStart, SinkState


class OutputConflict(RuntimeError):
    """A commit would replace committed output that is not its own; nothing was replaced."""


@dataclass(frozen=True)
class SinkName:
    """Who a sink subtask is: its transaction ids and the names of what it writes."""

    job_id: str
    pipeline_id: str
    operator_id: str
    subtask: int

    @property
    def txn_prefix(self) -> str:
        """Transaction ids are `{txn_prefix}:{epoch}`."""
        return f"{self.job_id}:{self.pipeline_id}:{self.operator_id}:{self.subtask}"

    def pattern(self, ext: str) -> re.Pattern[str]:
        """Matches this subtask's object names of any lineage; groups: lineage, epoch."""
        job, pipeline, op = (re.escape(p) for p in (self.job_id, self.pipeline_id, self.operator_id))
        return re.compile(rf"^{job}\.{pipeline}\.l(\d+)\.{op}\.{self.subtask}\.(\d{{10}})\.{re.escape(ext)}$")

    def object(self, lineage: int, epoch: int, ext: str) -> str:
        """The name of transaction `epoch`'s object in lineage `lineage`."""
        job = f"{self.job_id}.{self.pipeline_id}.l{lineage}"
        return f"{job}.{self.operator_id}.{self.subtask}.{epoch:010d}.{ext}"


class StagedSink:
    """Pending transactions, their snapshot, restore and recovery at a start; subclasses stage and publish."""

    def __init__(self, name: SinkName) -> None:
        """A sink subtask named `name`; the first open transaction is epoch 1 of lineage 1."""
        self.name = name
        self.txn_prefix = name.txn_prefix
        self.lineage = 1
        self.epoch = 1
        self.pending: list[PendingTxn] = []
        self.records = 0

    def _stage(self, epoch: int) -> None:
        """Make the open transaction's records durable under epoch `epoch` (only called with records)."""
        raise NotImplementedError

    def _publish(self, epoch: int, lineage: int) -> None:
        """Make a staged transaction of `lineage` visible; nothing to do when it already is;
        OutputConflict rather than replacing a committed object that is not this transaction's."""
        raise NotImplementedError

    def _staged_txns(self) -> list[tuple[int, int]]:
        """(lineage, epoch) of every transaction this subtask staged and did not publish."""
        raise NotImplementedError

    def _committed_epochs(self) -> list[int]:
        """The epochs this subtask published in its current lineage."""
        raise NotImplementedError

    def _drop(self, lineage: int, epoch: int) -> None:
        """Abort a staged transaction."""
        raise NotImplementedError

    def _where(self, epoch: int) -> str:
        """Where the current lineage's committed transaction `epoch` is, for messages."""
        raise NotImplementedError

    def prepare(self, epoch: int) -> None:
        """Barrier `epoch`: stage the open transaction (pre-commit) and open the next."""
        self._release()
        if self.records:
            self._stage(epoch)
            faults.reached("after-stage")
            txn = PendingTxn(
                f"{self.txn_prefix}:{epoch}", epoch, self.records, self.lineage, self._staged_state()
            )
            self.pending.append(txn)
        self.records = 0
        self.epoch = epoch + 1

    def _release(self) -> None:
        """Hook: finish writing the open transaction before it is staged."""

    def _staged_state(self) -> dict[str, Any]:
        """Hook: what the snapshot must hold of a transaction just staged (an outbox: its records)."""
        return {}

    def commit(self, upto: int) -> None:
        """Publish every pending transaction of an epoch <= upto."""
        for txn in [t for t in self.pending if t.epoch <= upto]:
            # a lineage started from an older one's epoch restores its pending transactions:
            # they were published under the older lineage's names
            faults.reached("before-publish")
            self._publish(txn.epoch, txn.lineage)
            faults.reached("mid-commit")
            self.pending.remove(txn)

    def recover(self, start: SinkStart) -> SinkRecovery:
        """Start of a run: refuse output ahead of the restore point, commit up to it, abort the rest."""
        self.lineage = start.lineage
        durable = start.durable or 0
        newest = max(self._committed_epochs(), default=0)
        if newest > durable:
            raise RestoreRefused(
                f"sink '{self.name.operator_id}' subtask {self.name.subtask} already committed epoch"
                f" {newest} ({self._where(newest)}), after the restore point"
                f" (epoch {start.durable if start.durable is not None else 'none'}): the manifest of a"
                " later epoch is missing (restore an older epoch explicitly with --restore-from,"
                " or start a new lineage with --fresh)"
            )
        recommitted = sum(1 for t in self.pending if t.epoch <= durable)
        self.commit(durable)
        aborted = [(ln, ep) for ln, ep in self._staged_txns() if ln != self.lineage or ep > durable]
        for lineage, epoch in aborted:
            self._drop(lineage, epoch)
        self.pending = []
        self.epoch = durable + 1
        return SinkRecovery(recommitted, len(aborted))

    def snapshot(self) -> dict[str, Any]:
        """Pending (pre-committed) transactions and the open transaction's epoch."""
        return SinkState(tuple(self.pending), {"epoch": self.epoch}).to_json()

    def restore(self, state: dict[str, Any]) -> None:
        """Resume with the snapshot's pending transactions."""
        restored = SinkState.from_json(state)
        self.pending = list(restored.pending)
        self.epoch = int(restored.rest.get("epoch", 1))


class ObjectSink(StagedSink):
    """A StagedSink whose transactions are named objects (files, S3 objects): `SinkName.object`,
    each written in `format` (lines, CSV's after a header, or Parquet)."""

    def __init__(self, name: SinkName, fmt: ObjectFormat, ext: str) -> None:
        """Objects of this subtask, named with `ext`, are recognised by their names."""
        super().__init__(name)
        self.format, self.ext = fmt, ext
        self._pattern = name.pattern(ext)
        self._writer: ObjectWriter | None = None  # the open transaction's object, once it has records

    def _add(self, records: list[Any], kind: str) -> bytes:
        """The bytes that follow in the open transaction's object, holding `records` (its first bytes
        for a new one); BadInput naming the `kind` sink and a record it cannot write (the same in
        every run: refused, never retried), with nothing written."""
        if self._writer is None:
            self._writer = self.format.writer()
        try:
            return self._writer.add(records)
        except BadRecord as err:
            raise BadInput(f"{kind} sink '{self.name.operator_id}': {err}") from None

    def _end(self) -> bytes:
        """The bytes that end the open transaction's object; the next records begin another."""
        writer, self._writer = self._writer, None
        return writer.end() if writer is not None else b""

    def _object(self, epoch: int, lineage: int | None = None) -> str:
        return self.name.object(self.lineage if lineage is None else lineage, epoch, self.ext)

    def _parse(self, name: str) -> tuple[int, int] | None:
        """(lineage, epoch) of one of this subtask's object names; None for anything else."""
        m = self._pattern.match(name)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def _staged_names(self) -> list[str]:
        """Names of the staged objects in the staging area (any sink's)."""
        raise NotImplementedError

    def _committed_names(self) -> list[str]:
        """Names of the committed objects (this subtask's current lineage among them)."""
        raise NotImplementedError

    def _drop_staged(self, name: str) -> None:
        """Delete a staged object."""
        raise NotImplementedError

    def _location(self, name: str) -> str:
        """A committed object's location, for messages."""
        raise NotImplementedError

    def _staged_txns(self) -> list[tuple[int, int]]:
        return [p for p in map(self._parse, self._staged_names()) if p is not None]

    def _committed_epochs(self) -> list[int]:
        return [
            e
            for lineage, e in filter(None, map(self._parse, self._committed_names()))
            if lineage == self.lineage
        ]

    def _drop(self, lineage: int, epoch: int) -> None:
        self._drop_staged(self._object(epoch, lineage))

    def _where(self, epoch: int) -> str:
        return self._location(self._object(epoch))
