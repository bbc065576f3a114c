"""The operator chain of one subtask: its operators in order after its source, sinks included.

What a task gets (a batch from a channel or its source, a watermark, a processing-time
tick, the end of input) runs through the chain from one operator on: each operator's
output goes to the next, its side outputs and the last one's output to `emit`, which
sends them on the task's output edges. The chain knows no channel and no barrier.
An operator's error reaches the task named after the operator (`errors.OperatorFailed`),
with the user's file and line; records an operator set aside are counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nopstream.errors import OperatorFailed, RestoreRefused
from nopstream.plan.nodes import DEAD_LETTER
from nopstream.plan.partitioned import ShardRange
from nopstream.plan.streamgraph import StreamNode
from nopstream.records import MAX_TIMESTAMP, MIN_TIMESTAMP, Batch, ConnectorFactory
from nopstream.runtime.keyed import ShardCache
from nopstream.runtime.operators.aggregates import PerKey
from nopstream.runtime.operators.base import Context, Operator
from nopstream.runtime.operators.lookups import Lookup
from nopstream.runtime.operators.registry import build_operator
from nopstream.runtime.operators.sinks import SinkOperator
from nopstream.runtime.operators.windows import Window

Emit = Callable[[str, str, Batch], Awaitable[None]]
"""emit(operator id, output name, batch): send an operator's output ("main" or a side output's tag)."""


class Chain:
    """The operators of one subtask after its source; what they emit goes to `emit`."""

    def __init__(
        self,
        nodes: Sequence[StreamNode],
        *,
        subtask: int,
        parallelism: int,
        shards: ShardRange | None,
        cache: ShardCache,
        connectors: ConnectorFactory,
        clock: Callable[[], int],
        emit: Emit,
        origin: str,
    ) -> None:
        """Build each node's operator (a sink's writer from `connectors`); `origin` names the main
        output of an empty chain (its source's)."""
        self.nodes = list(nodes)
        self.op_ids = [n.node_id for n in nodes]
        self.dead_letters = 0  # records the operators set aside (`onError: dead-letter`)
        self._dead_tags = [dead_letter_tag(n) for n in nodes]
        self.ops: list[Operator] = []
        self.sinks: list[SinkOperator] = []
        self.sink_ids: list[str] = []
        self._emit = emit
        self._side: list[tuple[str, str, Batch]] = []
        self._current = 0  # the operator running now: its side outputs and errors are named after it
        self._blame = _Blame(self)
        for node in nodes:
            if node.kind == "sink":
                sink = SinkOperator(connectors.sink(node, subtask=subtask, parallelism=parallelism))
                self.sinks.append(sink)
                self.sink_ids.append(node.node_id)
                self.ops.append(sink)
            else:
                ctx = Context(node, subtask, parallelism, shards, cache, self._collect_side, clock)
                ctx.connectors = connectors
                self.ops.append(build_operator(ctx))
        self._awaited = [getattr(op, "is_async", False) for op in self.ops]  # `on_batch_async` operators
        self.has_lookups = any(isinstance(op, Lookup) for op in self.ops)
        self.origin = self.op_ids[-1] if self.op_ids else origin
        self.processing_time = any(_uses_processing_time(n) for n in nodes)

    def _collect_side(self, tag: str, batch: Batch) -> None:
        if tag == self._dead_tags[self._current]:
            self.dead_letters += len(batch.records)
        self._side.append((self.op_ids[self._current], tag, batch))

    async def push(self, start: int, batch: Batch, input_index: int) -> None:
        """Run `batch` (of input `input_index` of operator `start`) through the chain from `start` on."""
        ops = self.ops
        for i in range(start, len(ops)):
            self._current = i
            with self._blame:
                if self._awaited[i]:
                    batch = await ops[i].on_batch_async(batch, input_index if i == start else 0)  # type: ignore[attr-defined]
                else:
                    batch = ops[i].on_batch(batch, input_index if i == start else 0)
            if self._side:
                await self._flush_side()
            if not batch.records:
                return
        await self._emit(self.origin, "main", batch)

    async def _flush_side(self) -> None:
        side, self._side = self._side, []
        for op_id, tag, batch in side:
            await self._emit(op_id, tag, batch)

    async def _each(self, call: Callable[[Operator], Batch | None]) -> None:
        """`call` on every operator in order, what each returns pushed on from the next."""
        for i, op in enumerate(self.ops):
            self._current = i
            with self._blame:
                out = call(op)
            await self._flush_side()
            if out is not None and out.records:
                await self.push(i + 1, out, 0)

    def merge_partials(self, batch: Batch) -> None:
        """The head (a final aggregate, reduce or window) merges a combiner's partial accumulators."""
        self._current = 0
        head = self.ops[0]
        assert isinstance(head, PerKey | Window), "combined edges end at a final aggregate, reduce or window"
        with self._blame:
            head.merge_partials(batch)

    async def advance(self, watermark: int) -> int:
        """Event time reached `watermark`: every operator fires what is due. The watermark to send on:
        behind `watermark` by what the operators hold back (an outer interval join's rows)."""
        for i, op in enumerate(self.ops):
            self._current = i
            with self._blame:
                out = op.on_watermark(watermark)
            await self._flush_side()
            if out is not None and out.records:
                await self.push(i + 1, out, 0)
            if op.watermark_delay and watermark != MAX_TIMESTAMP:
                watermark = max(MIN_TIMESTAMP, watermark - op.watermark_delay)
        return watermark

    async def tick(self, now: int) -> None:
        """The wall clock reached `now`: processing-time windows, patterns and timers fire."""
        await self._each(lambda op: op.on_processing_time(now))

    async def end(self) -> None:
        """No more input: every operator flushes what it holds (final aggregates, open windows)."""
        await self._each(lambda op: op.on_end())

    async def close(self) -> None:
        """Release what the operators hold open (their lookups' connections): the task ends."""
        await asyncio.gather(*(op.close() for op in self.ops if isinstance(op, Lookup)))

    def lookups(self) -> dict[str, float]:
        """The lookup operators' figures, summed: `hits`, `misses`, `in_flight`, `latency_ms` (mean)."""
        found = [op.stats() for op in self.ops if isinstance(op, Lookup)]
        misses = sum(f["misses"] for f in found)
        return {
            "hits": sum(f["hits"] for f in found),
            "misses": misses,
            "in_flight": sum(f["in_flight"] for f in found),
            "latency_ms": sum(f["seconds"] for f in found) * 1000 / misses if misses else 0.0,
        }

    def timers(self) -> int:
        """How many timers the operators hold."""
        return sum(op.timers() for op in self.ops)

    def snapshot(self) -> dict[str, Any]:
        """Each operator's state by its id (shared with the operators: the task copies it)."""
        return {op_id: op.snapshot() for op_id, op in zip(self.op_ids, self.ops, strict=True)}

    def restore(self, operators: dict[str, Any]) -> None:
        """Load the state `snapshot` gave, operator by operator (one a snapshot lacks starts empty)."""
        for op_id, op in zip(self.op_ids, self.ops, strict=True):
            if op_id in operators:
                op.restore(operators[op_id])


def _uses_processing_time(node: StreamNode) -> bool:
    spec = node.spec
    for part in ("window", "pattern"):
        if isinstance(spec.get(part), dict) and spec[part].get("time") == "processing":
            return True
    return node.type == "process"


def dead_letter_tag(node: StreamNode) -> str | None:
    """The side output `node` sets records aside on, when it dead-letters."""
    if node.spec.get("onError") != "dead-letter":
        return None
    return str(node.spec.get("deadLetterOutput") or DEAD_LETTER)


class _Blame:
    """`with chain._blame:` around an operator's call: its error leaves as an `OperatorFailed` naming
    the operator, the error and the user's frame, the error as its cause (a refusal, and a sink's
    error, as they are)."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, RestoreRefused | OperatorFailed):
            node = self.chain.nodes[self.chain._current]
            if node.kind == "sink":  # a connector's error (a full disk): as it is, in one line
                return
            raise OperatorFailed.of(f"{node.kind} '{node.node_id}' ({node.type})", exc) from exc
