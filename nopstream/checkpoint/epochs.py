"""The epoch coordinator: periodic epochs, ACKs, manifests, commits, and the final epoch.

One epoch in flight at a time. For epoch N the coordinator records CREATED in the
epoch log (a fenced write), asks every source task to inject barrier N, and waits for
an ACK from every task of the plan's ACK set (each ACK carries the task's segment
references, written by the task). With all ACKs it writes the manifest (segments
first, the manifest key last: the commit point), records DURABLE (moving
latest-durable in the same fenced write), notifies the tasks to commit, records
COMMITTED, and applies retention. An epoch not complete within the timeout is
ABORTED; its pending sink transactions stay pending until a later durable epoch
subsumes them. The final epoch is never aborted (its sources have ended and cannot
take another barrier): it waits for its late ACKs, saying so at every timeout. When
every source has read all its input, the next epoch is the final one; the run is over
when it is committed.
WARNING: nothing is committed before its manifest is durable; keep that order.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from nopstream import faults
from nopstream.checkpoint.catalog import apply_retention
from nopstream.checkpoint.formats import Manifest, SegmentRef, encode_manifest, manifest_path
from nopstream.checkpoint.storage import Storage
from nopstream.plan.canonical import fingerprint
from nopstream.plan.deployment import CheckpointSettings
from nopstream.plan.epochs import EpochKind, EpochState
from nopstream.plan.partitioned import PartitionedPlan

log = logging.getLogger(__name__)

Trigger = Callable[[int, EpochKind], Awaitable[None]]
"""Ask every source task to inject barrier (epoch, kind)."""
Notify = Callable[[int], Awaitable[None]]
"""Tell every task that epochs up to this one are durable (sinks commit)."""


class EpochRecorder(Protocol):
    """The epoch log as the coordinator's leadership writes it: every write fenced (Fenced once deposed)."""

    async def record(
        self,
        epoch: int,
        state: EpochState,
        *,
        kind: EpochKind = EpochKind.CHECKPOINT,
        run: int | None = None,
        manifest: str | None = None,
        reason: str | None = None,
        missing: tuple[str, ...] = (),
        adopted: bool = False,
    ) -> None:
        """Write `epoch`'s new state with what the coordinator says of it."""


class EpochHistory(Protocol):
    """Where each epoch's row goes as it moves (the dashboard's checkpoint history)."""

    def epoch_started(self, epoch: int, kind: EpochKind, run: int) -> None:
        """`epoch` was triggered in `run`."""

    def epoch_ended(self, epoch: int, **changes: Any) -> None:
        """`epoch`'s row changes (state, timings, reason)."""


@dataclass(frozen=True)
class Ack:
    """One task's report of an epoch: segments, source positions, pending sink transactions, alignment."""

    segments: tuple[SegmentRef, ...]
    sources: dict[str, Any]
    sinks: list[dict[str, Any]]
    alignment_ms: float = 0.0

    def to_json(self, epoch: int) -> dict[str, Any]:
        """The ACK of `epoch` as the JSON body a task sends."""
        segments = [ref.to_json() for ref in self.segments]
        return {
            "epoch": epoch,
            "segments": segments,
            "sources": self.sources,
            "sinks": self.sinks,
            "alignmentMs": self.alignment_ms,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Ack:
        """An ACK from its JSON body; ValueError when a part has the wrong shape."""
        segments, sources, sinks = body.get("segments"), body.get("sources", {}), body.get("sinks", [])
        if not (isinstance(segments, list) and isinstance(sources, dict) and isinstance(sinks, list)):
            raise ValueError("an ACK has a list of segments, an object of sources and a list of sinks")
        alignment = body.get("alignmentMs", 0.0)
        if not isinstance(alignment, int | float) or isinstance(alignment, bool) or alignment < 0:
            raise ValueError(f"alignmentMs of an ACK is a number >= 0, not {alignment!r}")
        try:
            refs = tuple(SegmentRef.from_json(s) for s in segments)
        except (KeyError, TypeError, ValueError):
            raise ValueError("each segment of an ACK has a path, a sha256 and a number of bytes") from None
        return cls(refs, sources, sinks, float(alignment))


@dataclass
class _Epoch:
    epoch: int
    kind: EpochKind
    started: float
    acks: dict[str, Ack] = field(default_factory=dict)
    acked_at: dict[str, float] = field(default_factory=dict)
    complete: asyncio.Event = field(default_factory=asyncio.Event)


class EpochCoordinator:
    """Drives epochs for one run of one job."""

    def __init__(
        self,
        plan: PartitionedPlan,
        storage: Storage,
        epoch_log: EpochRecorder,
        *,
        settings: CheckpointSettings,
        trigger: Trigger,
        notify: Notify,
        first_epoch: int = 1,
        restored: int | None = None,
        finished: bool = False,
        run: int = 0,
        clock: Callable[[], float] = time.monotonic,
        history: EpochHistory | None = None,
    ) -> None:
        """Coordinate run `run` of `plan`'s tasks, restored from `restored`, numbering from `first_epoch`.

        With `finished` the restored epoch is the job's final one: `run` returns at once.
        Each epoch's row goes to `history` (the dashboard's checkpoint history) as it moves.
        """
        self.plan = plan
        self.storage = storage
        self.log = epoch_log
        self.settings = settings
        self.trigger = trigger
        self.notify = notify
        self.next_epoch = first_epoch
        self.run_number = run
        self.clock = clock
        self.history = history
        self.fingerprint = fingerprint(plan)
        self.sources = set(plan.source_task_ids())
        self.finished_sources: set[str] = set()
        self.in_flight: _Epoch | None = None
        self.latest_durable: int | None = restored
        # wall time of the latest durable epoch of this run, or of the run's start before it has one
        self.latest_durable_at = time.time()
        self.done = asyncio.Event()
        if finished:
            self.done.set()
        self.durable_count = 0
        self.aborted_count = 0
        self.latest_committed: int | None = None
        self.last_duration_ms = 0
        self.savepoints: list[int] = []
        self._savepoint_requested: EpochKind | None = None  # SAVEPOINT, or STOP (stop with a savepoint)
        self._wake = asyncio.Event()  # the wait between epochs ends early: sources finished, a savepoint
        self.stopped = False
        self._adopted: _Epoch | None = None
        self._manifest_write: asyncio.Future[None] | None = None
        self.on_fault: Callable[[], None] | None = None  # what a fault point does here (tests)

    def adopt(self, epoch: int, kind: EpochKind, acks: dict[str, Ack]) -> None:
        """Take over an epoch a previous coordinator left in flight, with the ACKs the tasks still hold.

        `run` then starts with it: it is triggered again (sources that injected it
        already ignore the repeat) and completes like any other epoch.
        """
        self._adopted = _Epoch(epoch, kind, self.clock(), dict(acks))
        self.next_epoch = epoch + 1

    async def settle(self) -> None:
        """Wait for a manifest write still running in its thread (after `run` was cancelled).

        Whoever picks the next restore point must call this first: a manifest that
        lands after the choice would be a durable epoch the new run never saw.
        """
        if self._manifest_write is not None:
            await asyncio.gather(self._manifest_write, return_exceptions=True)

    def request_savepoint(self, *, stop: bool = False) -> None:
        """Make the next epoch a savepoint (a durable epoch that retention never deletes).

        With `stop`, sources read nothing after its barrier, and `run` returns once it
        is committed: the state and the output stand still at that savepoint, ready
        for a redeployment (an upgrade or rescale) to go on from it.
        """
        self._savepoint_requested = EpochKind.STOP if stop else EpochKind.SAVEPOINT
        self._wake.set()

    @property
    def finishing(self) -> bool:
        """Whether the final epoch is taken or in flight: nothing, a savepoint neither, comes after it."""
        current = self.in_flight
        return self.done.is_set() or (current is not None and current.kind == EpochKind.FINAL)

    def source_finished(self, task_id: str) -> None:
        """A source task has read everything."""
        self.finished_sources.add(task_id)
        self._wake.set()

    def ack(self, task_id: str, epoch: int, ack: Ack) -> None:
        """A task's ACK for `epoch` (late ACKs of aborted epochs are ignored)."""
        current = self.in_flight
        if current is None or current.epoch != epoch:
            log.info("ignoring ACK of %s for epoch %d (not in flight)", task_id, epoch)
            return
        current.acks[task_id] = ack
        current.acked_at[task_id] = self.clock()
        if set(current.acks) >= set(self.plan.ack_set):
            current.complete.set()

    async def run(self) -> None:
        """Take epochs, the first one an interval after a fresh start (as Flink does), until the final one.

        An epoch adopted from a predecessor is taken at once, and so is a restored run's
        first: its sources inject it after their first batch, so the output a recovery
        holds back is committed as soon as the run has any, not an interval later.
        """
        interval = self.settings.interval_ms / 1000
        if self._adopted is None and self.latest_durable is None and not self.done.is_set():
            await self._wait_interval(interval)
        while not self.done.is_set():
            # a savepoint asked for when the sources have finished comes before the final epoch
            final = self.finished_sources >= self.sources and not self._savepoint_requested
            await self._take(final)
            if not final:
                await self._wait_interval(interval)

    async def _wait_interval(self, interval: float) -> None:
        """Wait out the interval, or less: the final epoch and a savepoint are taken as soon as they may."""
        deadline = self.clock() + interval
        while (
            self.clock() < deadline
            and not self.finished_sources >= self.sources
            and not self._savepoint_requested
        ):
            self._wake.clear()
            with contextlib.suppress(TimeoutError):  # the clock is read again at least every 50 ms
                async with asyncio.timeout(min(0.05, interval)):
                    await self._wake.wait()

    async def _take(self, final: bool) -> None:
        if self._adopted is not None:
            current, self._adopted = self._adopted, None
            epoch, kind, final = current.epoch, current.kind, current.kind == EpochKind.FINAL
            adopted = True
        else:
            epoch = self.next_epoch
            self.next_epoch += 1
            kind = EpochKind.FINAL if final else self._savepoint_requested or EpochKind.CHECKPOINT
            current = _Epoch(epoch, kind, self.clock())
            adopted = False
        self.in_flight = current
        await self.log.record(epoch, EpochState.CREATED, kind=kind, run=self.run_number, adopted=adopted)
        if self.history is not None:
            self.history.epoch_started(epoch, kind, self.run_number)
        await self.trigger(epoch, kind)
        if set(current.acks) >= set(self.plan.ack_set):
            current.complete.set()
        if not await self._acked(current):
            return
        await self._make_durable(current)
        if kind.is_savepoint:
            self._savepoint_requested = None
            self.savepoints.append(epoch)
        self.in_flight = None
        if kind == EpochKind.STOP:
            self.stopped = True
        if final or self.stopped:
            self.done.set()

    async def _acked(self, current: _Epoch) -> bool:
        """Wait for every ACK of `current`; False when it timed out and was aborted.

        A final epoch is never aborted: its sources have ended their input and cannot
        take another barrier, so its late ACKs are the only ones it can get. It waits
        on, saying so at each timeout; a task that died ends the run instead.
        """
        limit = self.settings.timeout_ms / 1000
        waited = 0.0
        while True:
            try:
                async with asyncio.timeout(limit):
                    await current.complete.wait()
                return True
            except TimeoutError:
                waited += limit
                missing = sorted(set(self.plan.ack_set) - set(current.acks))
                shown = ", ".join(missing[:3])
                if current.kind == EpochKind.FINAL:
                    log.warning(
                        "final epoch %d still waits for %d ACKs (%s) after %g s: a final epoch is never"
                        " aborted (its sources have ended)",
                        current.epoch,
                        len(missing),
                        shown,
                        waited,
                    )
                    continue
                log.warning("epoch %d timed out waiting for %d ACKs (%s)", current.epoch, len(missing), shown)
                await self.log.record(
                    current.epoch,
                    EpochState.ABORTED,
                    reason="timeout",
                    missing=tuple(missing),
                )
                self._ended(current.epoch, state="aborted", reason=f"timeout: no ACK of {shown}")
                self.in_flight = None
                self.aborted_count += 1
                return False

    def _ended(self, epoch: int, **changes: Any) -> None:
        if self.history is not None:
            self.history.epoch_ended(epoch, **changes)

    async def _make_durable(self, current: _Epoch) -> None:
        ident = self.plan.identity
        acks = sorted(current.acks.items())
        manifest = Manifest(
            job_id=ident.job_id,
            pipeline_id=ident.pipeline_id,
            checkpoint_namespace=ident.checkpoint_namespace,
            plan_version=ident.plan_version,
            epoch=current.epoch,
            kind=current.kind,
            plan_fingerprint=self.fingerprint,
            created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            duration_ms=int((self.clock() - current.started) * 1000),
            tasks={t: a.segments for t, a in acks},
            sources={t: a.sources for t, a in acks if a.sources},
            sinks={t: a.sinks for t, a in acks if a.sinks},
        )
        path = manifest_path(ident.checkpoint_namespace, current.epoch)
        if self.on_fault is not None:  # the points where it kills a task (`nopstream run` gives the action)
            faults.reached("before-manifest", self.on_fault)
            if current.kind.is_savepoint:
                faults.reached("during-savepoint", self.on_fault)
        faults.reached("coordinator-before-manifest")  # the coordinator itself crashes
        # Shielded: once started, the write finishes even if this run is cancelled (see settle).
        self._manifest_write = asyncio.ensure_future(
            asyncio.to_thread(self.storage.put, path, encode_manifest(manifest))
        )
        await asyncio.shield(self._manifest_write)
        await self.log.record(
            current.epoch,
            EpochState.DURABLE,
            manifest=path,
            kind=current.kind,
            run=self.run_number,
        )
        self.latest_durable = current.epoch
        self.latest_durable_at = time.time()
        self.durable_count += 1
        self._ended(current.epoch, state="durable", **_timings(current, manifest))
        if self.on_fault is not None:
            faults.reached("after-durable", self.on_fault)
        faults.reached("coordinator-after-durable")  # the coordinator itself crashes, sinks not told
        await self.notify(current.epoch)
        await self.log.record(current.epoch, EpochState.COMMITTED, kind=current.kind, run=self.run_number)
        self.latest_committed = current.epoch
        self._ended(current.epoch, state="committed")
        self.last_duration_ms = int((self.clock() - current.started) * 1000)
        await asyncio.to_thread(
            apply_retention, self.storage, ident.checkpoint_namespace, keep=self.settings.retain_latest
        )


def _timings(current: _Epoch, manifest: Manifest) -> dict[str, Any]:
    """A durable epoch's row figures: end to end, the longest alignment, bytes, the last task to ACK."""
    slowest = max(current.acked_at, key=current.acked_at.__getitem__, default=None)
    return {
        "duration_ms": manifest.duration_ms,
        "alignment_ms": max((a.alignment_ms for a in current.acks.values()), default=0.0),
        "bytes": sum(ref.bytes for refs in manifest.tasks.values() for ref in refs),
        "slowest_task": slowest,
    }
