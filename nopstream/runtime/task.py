"""The task executor: one subtask of one vertex of a PartitionedPlan.

A task runs its vertex's chain of operators (`runtime.chain`) batch at a time. Input
frames come from its gate (every input channel); output batches are split by each
edge's partitioner and sent on the edge's channels, exactly as the plan says.
Barriers: a source task injects barrier N from its own reading loop, between batches,
after recording its split cursors; a task with several inputs aligns (blocks each
channel that delivered barrier N until all open channels have, ignoring ended ones:
`runtime.alignment`), then its sinks prepare (`runtime.sink_calls`), it snapshots
every operator of its chain and forwards the barrier. Watermarks are combined over
input channels and forwarded when they advance.
WARNING: the task never re-derives routing; every channel and policy is the plan's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import orjson

from nopstream import faults
from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import Edge, PartitionedPlan
from nopstream.plan.streamgraph import StreamNode
from nopstream.records import (
    MAX_TIMESTAMP,
    Batch,
    ConnectorFactory,
    SinkRecovery,
    SinkStart,
    SourceReader,
    SplitEventTime,
    TaskSnapshot,
)
from nopstream.runtime.alignment import Alignment, AlignmentError
from nopstream.runtime.chain import Chain
from nopstream.runtime.combiner import AnyCombiner, Drained, combined_edges, combiner_for
from nopstream.runtime.frames import Barrier, EndOfInput, EndOfStream, Frame, Watermark
from nopstream.runtime.gate import InputGate
from nopstream.runtime.intake import Intake
from nopstream.runtime.keyed import ShardCache
from nopstream.runtime.metrics import TaskMetrics, TaskStats
from nopstream.runtime.operators.sinks import SinkOperator
from nopstream.runtime.pacing import LoopHold, TaskSettings, next_batch_size, wall_clock_ms
from nopstream.runtime.partitioners import Partitioner
from nopstream.runtime.sink_calls import SinkCalls
from nopstream.runtime.taskports import TaskIO, TaskListener
from nopstream.runtime.transport import OutputChannel
from nopstream.runtime.watermarks import InputWatermarks, WatermarkGenerator, timestamp_function

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass
class _OutputEdge:
    edge: Edge
    partitioner: Partitioner
    channels: dict[int, OutputChannel]
    combiner: AnyCombiner | None = None


class Task:
    """Runs one subtask; `await connect()` then `await run()`."""

    def __init__(
        self,
        plan: PartitionedPlan,
        vertex_id: str,
        subtask: int,
        *,
        io: TaskIO,
        connectors: ConnectorFactory,
        listener: TaskListener | None = None,
        settings: TaskSettings | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        """Build the chain, the input gate and the partitioners of a subtask."""
        self.plan = plan
        self.vertex = plan.vertex(vertex_id)
        self.subtask = self.vertex.subtasks[subtask]
        self.task_id = self.subtask.task_id
        self.io = io
        self.listener = listener
        self.settings = settings or TaskSettings()
        self.clock = clock
        self.metrics = TaskMetrics()
        self.gate = InputGate()
        self._pending_barriers: deque[Barrier] = deque()
        self._last_triggered = 0
        self._deferred_final: Barrier | None = None  # a final barrier asked for before the end of input
        self._stopped = False
        self._barrier_arrived = asyncio.Event()
        self.final_epoch: int | None = None
        self.finished_before = False  # restored from the job's final epoch: nothing left to do
        self._data_ended = False  # operators flushed at end of data (kept in snapshots: never twice)
        self._read_size = self.settings.batch_size  # adapted to the chain's speed (`next_batch_size`)
        self._final_committed = asyncio.Event()
        self._failure: BaseException | None = None  # a sink call or snapshot write failed outside the loop
        self._failed = asyncio.Event()
        self._written: asyncio.Future[None] | None = None  # the last snapshot handed over, until written
        chain = list(self.vertex.operators)
        self.source_node: StreamNode | None = chain.pop(0) if chain[0].kind == "source" else None
        self.source: SourceReader | None = None
        if self.source_node is not None:
            (splits,) = [s for s in plan.sources if s.operator_id == self.source_node.node_id]
            parallelism = self.vertex.parallelism
            self.source = connectors.source(
                self.source_node, splits, subtask=subtask, parallelism=parallelism
            )
        self.chain = Chain(
            chain,
            subtask=subtask,
            parallelism=self.vertex.parallelism,
            shards=self.subtask.shards,
            cache=ShardCache(plan.identity.state_shard_count),
            connectors=connectors,
            clock=clock,
            emit=self._emit,
            origin=self.source_node.node_id if self.source_node else "",
        )
        self.sink_calls = SinkCalls(
            self.chain.sinks, task_id=self.task_id, limit_s=self.settings.sink_call_s, on_failure=self._fail
        )
        self._generator: WatermarkGenerator | None = None
        self.intake: Intake | None = None  # a source task's: timestamps, marks, dead letters
        self._source_side: list[tuple[str, Batch]] = []
        if self.source_node is not None:
            self._take_from_source(self.source_node)
        self.watermarks = InputWatermarks(_input_channels(plan, vertex_id, subtask, io, self.gate))
        self._outputs: list[_OutputEdge] = []
        self._combined = combined_edges(plan)  # edges whose records travel as partial accumulators

    def _take_from_source(self, node: StreamNode) -> None:
        """The intake of a source task's records: their timestamps, watermarks and bad records."""
        watermark_spec = node.spec.get("watermark")
        timestamps = timestamp_function(watermark_spec) if watermark_spec else None
        if watermark_spec:
            self._generator = WatermarkGenerator(watermark_spec, self.clock)
        # asked once: a protocol isinstance check is too slow for every batch
        split_times = None
        if self._generator is not None and isinstance(self.source, SplitEventTime):
            split_times = self.source
        self.intake = Intake(node, timestamps, self._generator, split_times, self._set_aside)

    # --- set-up ------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open every output channel of this subtask (none when the job finished before)."""
        if self.finished_before:
            return
        for edge in self.plan.edges:
            if edge.source_vertex != self.vertex.vertex_id:
                continue
            target = self.plan.vertex(edge.target_vertex)
            channels: dict[int, OutputChannel] = {}
            for ch in edge.channels:
                if ch.upstream == self.subtask.index:
                    task = target.subtasks[ch.downstream].task_id
                    channels[ch.downstream] = await self.io.output(edge.channel_id(ch), task)
            combiner = None
            target_op = self.plan.operators()[edge.target_operator]
            if edge.edge_id in self._combined:
                combiner = combiner_for(edge, target_op, limit=self.settings.combiner_keys)
            partitioner = Partitioner(edge, sorted(channels), target_op)
            self._outputs.append(_OutputEdge(edge, partitioner, channels, combiner))

    def metric_values(self) -> dict[str, float]:
        """Current counters for metrics (see `runtime.metrics`)."""
        m = self.metrics
        return {
            "records_in": m.records_in,
            "records_out": m.records_out,
            "barriers": m.barriers,
            "watermark": float(m.watermark) if m.watermark is not None else 0.0,
            "alignment_ms": m.alignment_ms,
            "snapshot_bytes": m.snapshot_bytes,
            "pending_transactions": self.sink_calls.pending_transactions(),
            "fenced_attempts": self.fenced_attempts(),
            "refused_commands": m.refused_commands,
            "dead_letters": self.dead_letters(),
            **{f"lookup_{name}": value for name, value in self.chain.lookups().items()},
        }

    def dead_letters(self) -> int:
        """Records set aside so far by the source and the operators (`onError: dead-letter`)."""
        return self.chain.dead_letters + (self.intake.set_aside if self.intake is not None else 0)

    def summary(self) -> str:
        """How the task ended, for the log of the process it ran in: records, and that process's CPU."""
        m, cpu = self.metrics, time.process_time()
        records = f"{m.records_in} records in, {m.records_out} out"
        return f"task {self.task_id} finished: {records}, {cpu:.2f} s of CPU"

    def stats(self) -> TaskStats:
        """The counters a task process sends its coordinator (`runtime.metrics.TaskStats`)."""
        m = self.metrics
        blocked = sum(ch.window.blocked_seconds() for out in self._outputs for ch in out.channels.values())
        return TaskStats(
            m.records_in,
            m.records_out,
            m.watermark,
            int((time.monotonic() - m.started) * 1000),
            int(m.idle_now() * 1000),
            int(blocked * 1000),
            self.channel_stats(),
            self.dead_letters(),
            self.chain.lookups() if self.chain.has_lookups else {},
        )

    async def _idle(self, waiting: Awaitable[T]) -> T:
        """Await what the task waits on (input, a barrier, an empty source's poll): its time is idle."""
        m = self.metrics
        m.idle_since = time.monotonic()
        try:
            return await waiting
        finally:
            m.idle_seconds += time.monotonic() - m.idle_since
            m.idle_since = None

    def fenced_attempts(self) -> int:
        """Channels refused by this task's transport because of their run (0 on local channels)."""
        fencing = getattr(getattr(self.io, "receiver", None), "fencing", None)
        return int(getattr(fencing, "refused", 0))

    def channel_stats(self) -> dict[str, dict[str, int]]:
        """Per channel: the most credit units ever outstanding (outputs) or buffered (inputs)."""
        stats = {
            ch.channel_id: {"maxOutstanding": ch.window.max_outstanding, "window": ch.window.window}
            for out in self._outputs
            for ch in out.channels.values()
        }
        for ch in self.gate.channels:
            stats.setdefault(ch.channel_id, {})["maxBuffered"] = ch.max_buffered_units
        return stats

    def restore(self, state: TaskSnapshot) -> None:
        """Load a task snapshot taken by `snapshot`."""
        self.chain.restore(state.operators)
        if self.source is not None and state.source is not None:
            self.source.restore(state.source)
        if self._generator is not None and state.source_watermark is not None:
            self._generator.restore(state.source_watermark)
        self.watermarks.restore(state.watermarks or {})
        self._data_ended = state.data_ended
        if state.read_size is not None:
            # a slow chain's first batch after a restore would otherwise be a full one,
            # holding the first barrier (and the first new output) back by seconds
            self._read_size = max(1, min(self.settings.batch_size, int(state.read_size)))

    def trigger_barrier(self, epoch: int, kind: EpochKind = EpochKind.CHECKPOINT) -> bool:
        """Ask a source task to inject barrier `epoch` at its next safe point; False if it already has.

        A coordinator that takes over an epoch in flight triggers it again: sources
        that injected it already ignore the repeat, the others inject it now.
        """
        if self.source is None:
            raise RuntimeError(f"task {self.task_id} is not a source task; barriers start at sources")
        if epoch <= self._last_triggered:
            return False
        self._last_triggered = epoch
        if kind == EpochKind.FINAL and not self._data_ended:
            # A final barrier before this source has read all its input (a forged or mistaken
            # source-finished): injected at the end of its input, so that every record it
            # reads meanwhile is in the final epoch instead of after it, lost.
            log.warning(
                "task %s: final barrier %d before the end of its input: deferred", self.task_id, epoch
            )
            self._deferred_final = Barrier(epoch, kind)
            return True
        self._pending_barriers.append(Barrier(epoch, kind))
        self._barrier_arrived.set()
        return True

    async def commit(self, upto: int) -> None:
        """Epoch `upto` is durable: the sinks publish their transactions up to it."""
        await self.sink_calls.each(lambda sink: sink.commit(upto))
        if self.final_epoch is not None and upto >= self.final_epoch:
            self._final_committed.set()

    def _fail(self, failure: BaseException) -> None:
        if self._failure is None:
            self._failure = failure
            self._failed.set()

    async def _unless_failed(self, work: Awaitable[object]) -> None:
        """Await `work`, or raise the task's failure as soon as a sink call fails (`work` cancelled)."""
        running = await run_until(work, self._failed)
        if self._failure is not None:
            raise self._failure
        running.result()

    async def final_committed(self) -> None:
        """Return once the final epoch has been committed; raise when a sink call failed."""
        await self._unless_failed(self._final_committed.wait())

    async def recover(self, start: SinkStart, *, final: bool = False) -> SinkRecovery:
        """Start of a run, after any `restore`, before any record: every sink recovers to the restore point;
        what they re-committed and aborted, summed.

        With `final` the restored epoch is the job's final one: the job finished in an
        earlier run, and `run` does nothing (it would emit the final results again).
        """
        done: list[SinkRecovery] = []
        await self.sink_calls.each(lambda sink: done.append(sink.recover(start)))
        if final:
            self.finished_before = True
            self.final_epoch = start.durable
            self._final_committed.set()
        return sum(done, SinkRecovery())

    def timers(self) -> int:
        """How many timers the task's operators hold (after a restore: the ones rebuilt from its state)."""
        return self.chain.timers()

    # --- the loops ---------------------------------------------------------------------

    async def run(self) -> None:
        """Process all input, end the data, take the final barrier, end the stream.

        End of data comes before the final barrier on every channel, so what operators
        flush at end of input (final aggregates, open windows) is in the final epoch.
        A task restored from the final epoch has nothing to do. A sink call that fails
        meanwhile (a commit command's) ends it with that failure.
        """
        await self._unless_failed(self._run())

    async def _run(self) -> None:
        if self.finished_before:
            if self.source is not None:
                self.source.close()
            return
        if self.source is not None:
            await self._run_source()
        else:
            await self._run_inputs()
        await self._send_all(EndOfStream())
        await asyncio.gather(*(ch.close() for out in self._outputs for ch in out.channels.values()))
        if self.source is not None:
            self.source.close()
        await self._snapshots_written()
        if self.chain.sinks and self.listener is None:  # no checkpointing: publish what is held
            await self.sink_calls.each(SinkOperator.publish_held)
        elif self.chain.sinks:
            await self._final_committed.wait()

    async def _run_source(self) -> None:
        assert self.source is not None
        reader, gen, intake = self.source, self._generator, self.intake
        assert intake is not None
        floor = intake.splits.event_time_floor if intake.splits is not None else None
        idle, pause = self.settings.idle_poll_ms / 1000, self.settings.source_pause_ms / 1000
        while True:
            while self._pending_barriers:
                await self._snapshot_and_forward(self._pending_barriers.popleft())
            if self._stopped:  # after a stop-with-savepoint barrier: barriers only, no more records
                await self._idle(self._barrier_arrived.wait())
                self._barrier_arrived.clear()
                continue
            batch = reader.read(self._read_size)
            if batch is None:
                break
            if not batch.records:
                await self._source_watermark(gen, floor)
                await self._tick()
                await self._idle(asyncio.sleep(idle))
                continue
            self.metrics.records_in += len(batch.records)
            batch = intake.take(batch)
            if self._source_side:
                await self._flush_source_side()
            held = LoopHold()
            await self.chain.push(0, batch, 0)
            self._read_size = next_batch_size(
                self._read_size, len(batch.records), held.seconds(), self.settings
            )
            await self._source_watermark(gen, floor)
            await self._tick()
            await self._idle(asyncio.sleep(pause))
        await self._end_of_data(event_time=gen is not None)
        if self._deferred_final is not None:
            self._pending_barriers.append(self._deferred_final)
            self._deferred_final = None
        if self.listener is not None:
            await self.listener.on_source_finished(self)
        while self._pending_barriers or (self.listener is not None and self.final_epoch is None):
            while self._pending_barriers:
                await self._snapshot_and_forward(self._pending_barriers.popleft())
            if self.listener is not None and self.final_epoch is None:
                await self._idle(self._barrier_arrived.wait())
                self._barrier_arrived.clear()

    async def _end_of_data(self, *, event_time: bool) -> None:
        """No more records will come: event time ends, operators flush, outputs learn it.

        A task restored from an epoch taken after its data ended does not flush again:
        what its operators emitted then is in that epoch already.
        """
        if not self._data_ended:
            if event_time:
                await self._advance_watermark(MAX_TIMESTAMP)
            await self.chain.end()
            self._data_ended = True
        await self._flush_combiners()
        await self._send_all(EndOfInput())

    def _set_aside(self, tag: str, batch: Batch) -> None:
        self._source_side.append((tag, batch))

    async def _flush_source_side(self) -> None:
        """Send what the source set aside (its dead letters) on its side outputs."""
        assert self.source_node is not None
        side, self._source_side = self._source_side, []
        for tag, batch in side:
            await self._emit(self.source_node.node_id, tag, batch)

    async def _source_watermark(
        self, gen: WatermarkGenerator | None, floor: Callable[[], int | None] | None
    ) -> None:
        """Emit the source's watermark when it moved (held to `floor()`, a reader's slowest split)."""
        due = gen.due(floor() if floor is not None else None) if gen is not None else None
        if due is None:
            return
        wm, idle = due
        if idle:  # downstream stops waiting for this channel's event time: nothing may be held back
            await self._flush_combiners()
            await self._send_all(Watermark(wm, idle=True))
        else:
            await self._advance_watermark(wm)

    async def _run_inputs(self) -> None:
        alignment = Alignment()
        tick = self.settings.tick_ms / 1000
        data_ended = False
        while self.gate.open_channels():
            if self.chain.processing_time and not data_ended:
                try:
                    async with asyncio.timeout(tick):
                        ch, frame, units = await self._idle(self.gate.next())
                except TimeoutError:
                    await self._tick()
                    continue
            else:
                ch, frame, units = await self._idle(self.gate.next())
            if isinstance(frame, Batch):
                self.metrics.records_in += len(frame.records)
                self.watermarks.activity(ch.channel_id)
                if ch.edge_id in self._combined:  # the chain's head is a final aggregate or reduce
                    self.chain.merge_partials(frame)
                else:
                    await self.chain.push(0, frame, ch.input_index)
                await self._tick()
            elif isinstance(frame, Watermark):
                advanced = self.watermarks.update(ch.channel_id, frame.timestamp, idle=frame.idle)
                if advanced is not None:
                    await self._advance_watermark(advanced)
            elif isinstance(frame, Barrier):
                try:
                    alignment.arrive(ch.channel_id, frame, time.monotonic())
                except AlignmentError as error:
                    raise RuntimeError(f"task {self.task_id}: {error}") from None
                self.gate.block(ch)
                if alignment.waiting(self.gate.open_channel_ids()):
                    faults.reached("during-alignment")
            elif isinstance(frame, EndOfInput):
                ch.ended = True
                advanced = self.watermarks.end(ch.channel_id)
                if advanced is not None and advanced != MAX_TIMESTAMP:
                    await self._advance_watermark(advanced)
                if self.gate.data_ended() and not data_ended:
                    data_ended = True
                    # event time is over: the last end moved it to MAX without firing, so fire once here
                    await self._end_of_data(event_time=bool(self.watermarks.marks))
            elif isinstance(frame, EndOfStream):
                ch.closed = True
            ch.consumed(units)
            aligned = alignment.complete(self.gate.open_channel_ids()) if alignment.barrier else None
            if aligned is not None:
                self.metrics.alignment_ms = (time.monotonic() - alignment.started) * 1000
                await self._snapshot_and_forward(aligned)
                self.gate.unblock_all()
        if not data_ended:
            await self._end_of_data(event_time=bool(self.watermarks.marks))

    # --- sending on ------------------------------------------------------------------

    async def _emit(self, op_id: str, output: str, batch: Batch) -> None:
        """Send an output of the chain (operator `op_id`'s `output`) on every edge that carries it."""
        self.metrics.records_out += len(batch.records)
        for out in self._outputs:
            if out.edge.source_operator != op_id or out.edge.output != output:
                continue
            if out.combiner is not None:
                out.combiner.add(batch)
                if out.combiner.full:
                    await self._send_partials(out, out.combiner.drain())
                continue
            channels = out.channels
            for downstream, part in out.partitioner.split(batch):
                await channels[downstream].send(part)

    async def _send_partials(self, out: _OutputEdge, drained: Drained) -> None:
        """Send a combiner's partials, each to its key's owner."""
        if drained.records:
            for downstream, part in out.partitioner.route(drained.keys, drained.records):
                await out.channels[downstream].send(part)

    async def _flush_combiners(self, closed_by: int | None = None) -> None:
        """Before a barrier, an idle mark or the end of input goes out, every combiner sends what it
        holds; before watermark `closed_by` goes out, what it holds of the windows that closes."""
        for out in self._outputs:
            if out.combiner is not None:
                c = out.combiner
                await self._send_partials(out, c.drain() if closed_by is None else c.drain_closed(closed_by))

    async def _advance_watermark(self, watermark: int) -> None:
        """Event time reached `watermark`: the chain fires what is due, then the watermark goes on
        (behind by what the chain holds back)."""
        self.metrics.watermark = watermark
        watermark = await self.chain.advance(watermark)
        await self._flush_combiners(closed_by=watermark)
        await self._send_all(Watermark(watermark))

    async def _tick(self) -> None:
        if self.chain.processing_time:
            await self.chain.tick(self.clock())

    async def _send_all(self, frame: Frame) -> None:
        for out in self._outputs:
            for channel in out.channels.values():
                await channel.send(frame)

    # --- snapshots ----------------------------------------------------------------------

    def snapshot(self) -> TaskSnapshot:
        """A private copy of the task's state (JSON values, shared with nothing the task goes on changing)."""
        state = {
            "operators": self.chain.snapshot(),
            "source": self.source.snapshot() if self.source is not None else None,
            "watermarks": self.watermarks.snapshot(),
            "source_watermark": self._generator.snapshot() if self._generator is not None else None,
        }
        return TaskSnapshot(
            **orjson.loads(orjson.dumps(state)),
            data_ended=self._data_ended,
            read_size=self._read_size if self.source is not None else None,
        )

    async def _snapshot_and_forward(self, barrier: Barrier) -> None:
        await self._flush_combiners()  # partials of records before the barrier go before it
        if barrier.kind == EpochKind.FINAL:
            self.final_epoch = barrier.epoch
        elif barrier.kind == EpochKind.STOP:
            self._stopped = True
        # under the sinks' lock: a commit in flight changes their pending transactions
        state = await self.sink_calls.prepare(barrier.epoch, self.snapshot)
        self.metrics.barriers += 1
        if self.listener is not None:
            self._hand_over(barrier, state)
        await self._send_all(barrier)

    def _hand_over(self, barrier: Barrier, state: TaskSnapshot) -> None:
        """Give the listener a snapshot in the background, after the ones before it.

        The barrier goes on at once and records flow while the segments are written
        (Flink's asynchronous snapshot): an epoch is durable only once every task's
        write is, so nothing downstream depends on this one having finished. A failed
        write fails the task, and no later epoch is reported after it.
        """
        assert self.listener is not None
        listener, before = self.listener, self._written

        async def write() -> None:
            if before is not None:
                await before
            if self._failure is not None:
                return
            try:
                await listener.on_snapshot(self, barrier.epoch, barrier.kind, state)
            except Exception as exc:
                self._fail(exc)

        self._written = asyncio.ensure_future(write())

    async def _snapshots_written(self) -> None:
        """Return once every snapshot handed over has been written and reported."""
        if self._written is not None:
            await self._written


async def run_until(work: Awaitable[T], event: asyncio.Event) -> asyncio.Future[T]:
    """Run `work` until it ends or `event` is set, whichever comes first (then `work` is cancelled);
    its future, done or cancelled."""
    running, stop = asyncio.ensure_future(work), asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({running, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    return running


def _input_channels(
    plan: PartitionedPlan, vertex_id: str, subtask: int, io: TaskIO, gate: InputGate
) -> list[str]:
    """Register every input channel of the subtask in its gate; their ids."""
    inputs = []
    for edge in plan.edges:
        if edge.target_vertex != vertex_id:
            continue
        for ch in edge.channels:
            if ch.downstream == subtask:
                cid = edge.channel_id(ch)
                inputs.append(cid)
                io.input(gate, cid, edge_id=edge.edge_id, input_index=edge.input_index, upstream=ch.upstream)
    return inputs
