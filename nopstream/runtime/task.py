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
import time
from collections.abc import Callable

import orjson

from nopstream import faults
from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.plan.streamgraph import StreamNode
from nopstream.records import (
    MAX_TIMESTAMP,
    AcknowledgingSource,
    Batch,
    ConnectorFactory,
    SinkRecovery,
    SinkStart,
    SourceReader,
    SplitEventTime,
    TaskSnapshot,
)
from nopstream.runtime.alignment import Alignment, AlignmentError
from nopstream.runtime.background import Background
from nopstream.runtime.chain import Chain
from nopstream.runtime.combiner import combined_edges
from nopstream.runtime.frames import Barrier, EndOfInput, EndOfStream, Watermark
from nopstream.runtime.gate import InputGate
from nopstream.runtime.injection import Injections
from nopstream.runtime.intake import Intake
from nopstream.runtime.keyed import ShardCache
from nopstream.runtime.metrics import TaskMetrics, TaskStats
from nopstream.runtime.operators.sinks import SinkOperator
from nopstream.runtime.outputs import Outputs
from nopstream.runtime.pacing import LoopHold, TaskSettings, next_batch_size, wall_clock_ms
from nopstream.runtime.sink_calls import SinkCalls
from nopstream.runtime.taskports import TaskIO, TaskListener, input_channels
from nopstream.runtime.watermarks import InputWatermarks, WatermarkGenerator, timestamp_function


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
        self.injections = Injections(self.task_id)
        self._stopped = False
        self.final_epoch: int | None = None
        self.finished_before = False  # restored from the job's final epoch: nothing left to do
        self._data_ended = False  # operators flushed at end of data (kept in snapshots: never twice)
        self._read_size = self.settings.batch_size  # adapted to the chain's speed (`next_batch_size`)
        self._final_committed = asyncio.Event()
        self.background = Background()  # snapshot writes, and a sink call's or a write's failure
        chain = list(self.vertex.operators)
        self.source_node: StreamNode | None = chain.pop(0) if chain[0].kind == "source" else None
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
            self.chain.sinks,
            task_id=self.task_id,
            limit_s=self.settings.sink_call_s,
            on_failure=self.background.fail,
        )
        self.source: SourceReader | None = None
        self._generator: WatermarkGenerator | None = None
        self.intake: Intake | None = None  # a source task's: timestamps, marks, dead letters
        self._source_side: list[tuple[str, Batch]] = []
        if self.source_node is not None:
            self._take_from_source(self.source_node, connectors)
        self.watermarks = InputWatermarks(input_channels(plan, vertex_id, subtask, io, self.gate))
        self._combined = combined_edges(plan)  # edges whose records travel as partial accumulators
        self.outputs = Outputs(plan, vertex_id, subtask, combined=self._combined)

    def _take_from_source(self, node: StreamNode, connectors: ConnectorFactory) -> None:
        """A source task's reader, and the intake of its records: timestamps, watermarks, bad records."""
        (splits,) = [s for s in self.plan.sources if s.operator_id == node.node_id]
        parallelism = self.vertex.parallelism
        self.source = connectors.source(node, splits, subtask=self.subtask.index, parallelism=parallelism)
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
        if not self.finished_before:
            await self.outputs.connect(self.io, combiner_keys=self.settings.combiner_keys)

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
        blocked = sum(ch.window.blocked_seconds() for ch in self.outputs.channels())
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

    def fenced_attempts(self) -> int:
        """Channels refused by this task's transport because of their run (0 on local channels)."""
        fencing = getattr(getattr(self.io, "receiver", None), "fencing", None)
        return int(getattr(fencing, "refused", 0))

    def channel_stats(self) -> dict[str, dict[str, int]]:
        """Per channel: the most credit units ever outstanding (outputs) or buffered (inputs)."""
        stats = {
            ch.channel_id: {"maxOutstanding": ch.window.max_outstanding, "window": ch.window.window}
            for ch in self.outputs.channels()
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

        A repeat is ignored; a final barrier before the end of input waits for it (`runtime.injection`).
        """
        if self.source is None:
            raise RuntimeError(f"task {self.task_id} is not a source task; barriers start at sources")
        return self.injections.ask(epoch, kind, data_ended=self._data_ended)

    async def commit(self, upto: int) -> None:
        """Epoch `upto` is durable: the sinks publish their transactions up to it, and a source whose
        origin keeps what it read lets go of it."""
        if isinstance(self.source, AcknowledgingSource):
            try:
                self.source.durable(upto)
            except Exception as exc:
                # Its origin cannot be told (a closed connection): the task fails, crash-only, and the
                # next run tells it again. Only answering the command with the error would leave the
                # coordinator asking for this commit for ever.
                self.background.fail(exc)
                raise
        await self.sink_calls.each(lambda sink: sink.commit(upto))
        if self.final_epoch is not None and upto >= self.final_epoch:
            self._final_committed.set()

    async def final_committed(self) -> None:
        """Return once the final epoch has been committed; raise when a sink call failed."""
        await self.background.unless_failed(self._final_committed.wait())

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
        try:
            await self.background.unless_failed(self._run())
        finally:
            await self.chain.close()

    async def _run(self) -> None:
        if self.finished_before:
            if self.source is not None:
                self.source.close()
            return
        if self.source is not None:
            await self._run_source()
        else:
            await self._run_inputs()
        await self.outputs.send_all(EndOfStream())
        await asyncio.gather(*(ch.close() for ch in self.outputs.channels()))
        # a source whose origin keeps what it read is told of the final commit too, still open (its
        # slot confirms the final epoch's position; its snapshot copy goes)
        acknowledging = isinstance(self.source, AcknowledgingSource) and self.listener is not None
        if self.source is not None and not acknowledging:
            self.source.close()
        await self.background.written()
        if self.chain.sinks and self.listener is None:  # no checkpointing: publish what is held
            await self.sink_calls.each(SinkOperator.publish_held)
        elif self.chain.sinks or acknowledging:
            await self._final_committed.wait()
        if acknowledging and self.source is not None:
            self.source.close()

    async def _run_source(self) -> None:
        assert self.source is not None
        reader, gen, intake = self.source, self._generator, self.intake
        assert intake is not None
        floor = intake.splits.event_time_floor if intake.splits is not None else None
        idle, pause = self.settings.idle_poll_ms / 1000, self.settings.source_pause_ms / 1000
        barriers = self.injections
        # barriers are taken after each read, not before the first: one asked for at once (a
        # restored run's first epoch) then carries the first batch, so it commits output
        while True:
            if self._stopped:  # after a stop-with-savepoint barrier: barriers only, no more records
                await self.metrics.idle(barriers.wait())
                await self._take_barriers()
                continue
            batch = reader.read(self._read_size)
            if batch is None:
                break
            if not batch.records:
                await self._source_watermark(gen, floor)
                await self._tick()
                await self.metrics.idle(asyncio.sleep(idle))
                await self._take_barriers()
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
            await self.metrics.idle(asyncio.sleep(pause))
            await self._take_barriers()
        # chaos keeps the input from ending before its schedule is done; a source stopped meanwhile
        # takes barriers only, as above
        while faults.holding() or self._stopped:
            await self._take_barriers()
            await self._tick()
            await self.metrics.idle(asyncio.sleep(idle))
        await self._end_of_data(event_time=gen is not None)
        barriers.input_ended()
        if self.listener is not None:
            await self.listener.on_source_finished(self)
        while barriers.pending or (self.listener is not None and self.final_epoch is None):
            await self._take_barriers()
            if self.listener is not None and self.final_epoch is None:
                await self.metrics.idle(barriers.wait())

    async def _take_barriers(self) -> None:
        """Snapshot and forward every barrier injected into this source task so far, in order."""
        while self.injections.pending:
            await self._snapshot_and_forward(self.injections.pending.popleft())

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
        await self.outputs.flush_combiners()
        await self.outputs.send_all(EndOfInput())

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
            await self.outputs.flush_combiners()
            await self.outputs.send_all(Watermark(wm, idle=True))
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
                        ch, frame, units = await self.metrics.idle(self.gate.next())
                except TimeoutError:
                    await self._tick()
                    continue
            else:
                ch, frame, units = await self.metrics.idle(self.gate.next())
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
        await self.outputs.emit(op_id, output, batch)

    async def _advance_watermark(self, watermark: int) -> None:
        """Event time reached `watermark`: the chain fires what is due, then the watermark goes on
        (behind by what the chain holds back)."""
        self.metrics.watermark = watermark
        watermark = await self.chain.advance(watermark)
        await self.outputs.flush_combiners(closed_by=watermark)
        await self.outputs.send_all(Watermark(watermark))

    async def _tick(self) -> None:
        if self.chain.processing_time:
            await self.chain.tick(self.clock())

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
        await self.outputs.flush_combiners()  # partials of records before the barrier go before it
        if barrier.kind == EpochKind.FINAL:
            self.final_epoch = barrier.epoch
        elif barrier.kind == EpochKind.STOP:
            self._stopped = True
        # under the sinks' lock: a commit in flight changes their pending transactions
        state = await self.sink_calls.prepare(barrier.epoch, self.snapshot)
        if isinstance(self.source, AcknowledgingSource):
            self.source.snapshotted(barrier.epoch)
        self.metrics.barriers += 1
        if self.listener is not None:
            listener = self.listener
            self.background.write(lambda: listener.on_snapshot(self, barrier.epoch, barrier.kind, state))
        await self.outputs.send_all(barrier)
