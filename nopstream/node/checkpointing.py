"""Checkpointing on the task side: storage from the plan, restore, and writing snapshots.

Tasks write their own segments (`checkpoint.snapshots.split`) and ACK the coordinator
with the references; starting a task restores its segments from the run's restore
point (`checkpoint.restore`) and recovers its sinks, whatever started the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from nopstream import faults
from nopstream.checkpoint import restore, snapshots
from nopstream.checkpoint.epochs import Ack
from nopstream.checkpoint.formats import segment_ref
from nopstream.checkpoint.restore import RestorePoint
from nopstream.checkpoint.storage import LocalStorage, Storage
from nopstream.plan.deployment import DeploymentPlan
from nopstream.records import SinkRecovery, SinkStart, TaskSnapshot
from nopstream.runtime.task import Task

log = logging.getLogger(__name__)

RESTORED = "nopstream restored "
"""How the log line of a task's restore begins (`RestoreReport`)."""


@dataclass(frozen=True)
class RestoreReport:
    """What a task's start restored: the epoch and how much state of each kind.

    One line of the task's log (`RESTORED` and JSON), which `nopstream chaos` reads to
    tell what its kills reached: a recovery that restored nothing proves nothing about
    the restore path.
    """

    task_id: str
    epoch: int | None
    keyed_entries: int = 0
    timers: int = 0
    cursors: int = 0
    pending_transactions: int = 0
    recommitted: int = 0
    aborted: int = 0

    def to_line(self) -> str:
        """The log line."""
        return RESTORED + json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_line(cls, line: str) -> RestoreReport | None:
        """The report a log line holds, or None for any other line."""
        _, mark, body = line.partition(RESTORED)
        if not mark:
            return None
        try:
            return cls(**json.loads(body))
        except (ValueError, TypeError):
            return None

    @classmethod
    def of(
        cls, task: Task, epoch: int | None, state: TaskSnapshot | None, sinks: SinkRecovery
    ) -> RestoreReport:
        """The report of `task` restored from `epoch` into `state` (None: nothing restored), whose
        sinks recovered as `sinks` said."""
        if state is None:
            return cls(task.task_id, epoch, recommitted=sinks.recommitted, aborted=sinks.aborted)
        entries = sum(
            len(pairs)
            for op in state.operators.values()
            for names in (op.get("keyed") or {}).values()
            for name, pairs in names.items()
            if name != "timers"  # a process function's timers: counted as the timers rebuilt
        )
        source = state.source or {}
        return cls(
            task.task_id,
            epoch,
            keyed_entries=entries,
            timers=task.timers(),
            cursors=len(source.get("cursors") or source.get("offsets") or {}),
            pending_transactions=len(state.pending_transactions()),
            recommitted=sinks.recommitted,
            aborted=sinks.aborted,
        )


def open_storage(deployment: DeploymentPlan) -> Storage:
    """The checkpoint storage a deployment plan binds (S3 credentials: `nopstream.s3.credentials`)."""
    binding = deployment.storage
    if binding.kind == "s3":
        from nopstream.s3 import S3Storage  # minio, imported only by the jobs that use it

        return S3Storage.connect(binding.endpoint or "", binding.bucket or "", prefix=binding.prefix or "")
    return LocalStorage(binding.path or ".nopstream/checkpoints")


def task_parts(task: Task) -> dict[str, Any]:
    """The ids `snapshots.split` and `join` need for a task."""
    return {
        "vertex_id": task.vertex.vertex_id,
        "subtask": task.subtask.index,
        "source_id": task.source_node.node_id if task.source_node else None,
        "sink_ids": task.chain.sink_ids,
    }


async def start_task(task: Task, storage: Storage, point: RestorePoint) -> None:
    """The one rule for every start: restore the task from the restore point, then recover its sinks.

    Sinks commit what is durable and abort everything staged after it (everything
    when nothing is durable) before any record flows. A checkpoint of another plan (a
    rescale or upgrade) is redistributed by shard and split ownership (`snapshots.join`).
    Storage and sink I/O run in worker threads.
    """
    state = await asyncio.to_thread(_restore, task, storage, point)
    if state is not None:
        faults.reached("during-restore")
    sinks = await task.recover(SinkStart(point.epoch, point.lineage), final=point.finished)
    log.info("%s", RestoreReport.of(task, point.epoch, state, sinks).to_line())


def _restore(task: Task, storage: Storage, point: RestorePoint) -> TaskSnapshot | None:
    """Load the task's state from the restore point's checkpoint, when there is one; that state.

    Only the task's own part is read (`snapshots.needed`) and verified: the coordinator
    checked the manifest and that every segment is there when it chose the point.
    """
    if point.epoch is None:
        return None
    part = {
        **task_parts(task),
        "epoch": point.epoch,
        "operator_ids": task.chain.op_ids,
        "shards": task.subtask.shards,
        "rescaled": restore.rescaled(task.plan, point),
    }
    checkpoint = restore.load(storage, task.plan, point, select=snapshots.needed(task.plan, **part))
    assert checkpoint is not None
    state = snapshots.join(task.plan, segments=checkpoint.segments, **part)
    task.restore(state)
    return state


def write_snapshot(storage: Storage, task: Task, epoch: int, state: TaskSnapshot) -> Ack:
    """Write a task's segments (blocking I/O) and return its ACK."""
    parts = task_parts(task)
    segments = snapshots.split(task.plan, epoch=epoch, state=state, **parts)
    storage.put_many(segments)
    refs = tuple(segment_ref(path, data) for path, data in segments.items())
    task.metrics.snapshot_bytes = sum(len(data) for data in segments.values())
    # the manifest lists the pending transactions; their contents (an outbox's records) stay in segments
    sinks = [txn.summary() for txn in state.pending_transactions()]
    return Ack(refs, state.source or {}, sinks, round(task.metrics.alignment_ms, 3))


async def write_snapshot_async(storage: Storage, task: Task, epoch: int, state: TaskSnapshot) -> Ack:
    """`write_snapshot` in a worker thread, so the event loop keeps running."""
    return await asyncio.to_thread(write_snapshot, storage, task, epoch, state)
