"""The keyed process operator: a user class with keyed state and timers.

`fn` names a class (instantiated once per subtask) or an object with:

    process(record, ctx) -> iterable of output records
    on_timer(timestamp, ctx) -> iterable of output records      (optional)

With several inputs (Flink's connect and KeyedCoProcessFunction), each input is keyed
by its own selector (`keys`, one per input, or one `key` for all) into one key space:
the records of every input with equal keys share the key's state and timers, and
`ctx.input` says which input a record came from (its name as `inputs` lists it; None
in `on_timer`).

Broadcast state (Flink's KeyedBroadcastProcessFunction): the inputs named in
`broadcast` reach every subtask and go to `process_broadcast(record, ctx)`, which has
no current key and may write `ctx.broadcast_state(name)`, a dict of JSON values; in
`process` and `on_timer` the same call gives a read-only view. Every subtask gets every
broadcast record before each barrier, so each holds the same state when the updates do
not depend on their order (records of several upstream subtasks interleave differently
in each); it is part of every snapshot, and a subtask a rescale adds takes subtask 0's.
What a keyed record sees of it depends on when it arrives unless the function waits
for event time (docs/runtime.md: `examples/rules.yaml` does).

`ctx` is scoped to the current key: `ctx.key`, `ctx.input`, `ctx.timestamp`, `ctx.watermark` (in
`process`, the record's mark: its split's watermark when it was read, or the
operator's when that is further, so `ctx.timestamp <= ctx.watermark` says the record
is late by the data alone; in `on_timer`, the timer's timestamp: every record at or
before it that is not late has been processed, however far event time got since),
`ctx.value(name, default)`, `ctx.set_value(name, value)`, `ctx.clear(name)`,
`ctx.list(name)` and `ctx.map(name)` (mutable, stored), `ctx.register_event_timer(ts)`,
`ctx.register_processing_timer(ts)`, `ctx.delete_event_timer(ts)`,
`ctx.delete_processing_timer(ts)`. State values must be JSON-compatible; state and
timers live in the keyed state of the key's shard, so snapshots hold both. Event
timers fire when the watermark reaches them (all of them at end of input);
processing timers when the wall clock does. Outputs carry the timestamp of the
record or timer that produced them.

`stateTtlMs` expires a key's state (not its timers) that long after its last record:
in event time judged by each record's mark and each timer's timestamp, so the data
alone decides when a key's records come from one split; in processing time by the wall
clock. A snapshot leaves out the keys that have expired by the watermark.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from nopstream.records import MIN_TIMESTAMP, Batch, late_reference
from nopstream.runtime.functions import resolve
from nopstream.runtime.operators.base import Context, DeadLetters, KeyedOperator

EVENT, PROCESSING = "event", "processing"


class ProcessContext:
    """The per-key view a process function gets."""

    def __init__(self, op: Process) -> None:
        """Bound to one operator; `bind` sets the current key."""
        self._op = op
        self.key: Any = None
        self.input: str | None = None
        """The input the current record came from, as the operator's `inputs` names it (None for a timer)."""
        self.timestamp: int | None = None
        self.watermark = MIN_TIMESTAMP
        """Event time as this call sees it (see the module's docstring)."""
        self._state: dict[str, Any] | None = {}

    def bind(self, key: Any, timestamp: int | None, watermark: int) -> None:
        """Make `key` the current key, for a record or timer at `timestamp` seen at `watermark`."""
        self.key = key
        self.timestamp = timestamp
        self.watermark = watermark
        d = self._op.states[self._op.shard(key)]
        self._state = d.setdefault(key, {})

    def bind_broadcast(self, timestamp: int | None, watermark: int) -> None:
        """No current key: a broadcast record at `timestamp` seen at `watermark` (`process_broadcast`)."""
        self.key = None
        self.timestamp = timestamp
        self.watermark = watermark
        self._state = None

    def broadcast_state(self, name: str) -> Mapping[str, Any]:
        """The broadcast state `name` (string keys, JSON values): a dict in `process_broadcast`,
        a read-only view in `process` and `on_timer`."""
        if self._state is None:
            return self._op.broadcast.setdefault(name, {})
        return MappingProxyType(self._op.broadcast.get(name, {}))

    def _keyed(self) -> dict[str, Any]:
        if self._state is None:
            raise RuntimeError(
                "process_broadcast has no current key: keyed state and timers belong to process and on_timer"
            )
        return self._state

    def value(self, name: str, default: Any = None) -> Any:
        """A value state of the current key."""
        return self._keyed().get(name, default)

    def set_value(self, name: str, value: Any) -> None:
        """Set a value state of the current key."""
        self._keyed()[name] = value

    def clear(self, name: str) -> None:
        """Forget a state of the current key."""
        self._keyed().pop(name, None)

    def list(self, name: str) -> list[Any]:
        """A list state of the current key (mutate it in place)."""
        value: list[Any] = self._keyed().setdefault(name, [])
        return value

    def map(self, name: str) -> dict[str, Any]:
        """A map state of the current key, string keys (mutate it in place)."""
        value: dict[str, Any] = self._keyed().setdefault(name, {})
        return value

    def register_event_timer(self, timestamp: int) -> None:
        """Call `on_timer` when the watermark reaches `timestamp`."""
        self._keyed()
        self._op.add_timer(self.key, EVENT, int(timestamp))

    def register_processing_timer(self, timestamp: int) -> None:
        """Call `on_timer` when the wall clock reaches `timestamp` (ms)."""
        self._keyed()
        self._op.add_timer(self.key, PROCESSING, int(timestamp))

    def delete_event_timer(self, timestamp: int) -> None:
        """Cancel an event-time timer of the current key."""
        self._keyed()
        self._op.delete_timer(self.key, EVENT, int(timestamp))

    def delete_processing_timer(self, timestamp: int) -> None:
        """Cancel a processing-time timer of the current key."""
        self._keyed()
        self._op.delete_timer(self.key, PROCESSING, int(timestamp))


class Process(KeyedOperator):
    """Runs a user process function per key, with state and timers."""

    def __init__(self, ctx: Context) -> None:
        """Instantiate the user function and prepare state and timer tables."""
        self.ctx = ctx
        target = resolve(ctx.node.spec["fn"])
        self.fn = target() if isinstance(target, type) else target
        self.inputs: list[str] = ctx.node.spec["inputs"]
        self.key_fns = ctx.key_fns()
        self.dead = DeadLetters(ctx.node, ctx.side)
        broadcast = set(ctx.node.spec.get("broadcast") or ())
        self.broadcast_inputs = frozenset(i for i, name in enumerate(self.inputs) if name in broadcast)
        if self.broadcast_inputs and not callable(getattr(self.fn, "process_broadcast", None)):
            raise RuntimeError(
                f"process '{ctx.node.node_id}' has broadcast inputs, but '{ctx.node.spec['fn']}'"
                " has no process_broadcast(record, ctx)"
            )
        self.broadcast: dict[str, dict[str, Any]] = {}
        """The broadcast state: name -> {string key: JSON value}, the same in every subtask."""
        ttl = ctx.node.spec.get("stateTtlMs")
        self.ttl: int | None = int(ttl) if ttl is not None else None
        self.ttl_event = ctx.node.spec.get("stateTtlTime") != "processing"
        self.touched = ctx.keyed().table("touched")
        """key -> when its last record came (its timestamp, or the wall clock), with a TTL only."""
        self.states = ctx.keyed().table("state")
        self.timer_table = ctx.keyed().table("timers")
        self.shard = ctx.shard_cache.shard
        self.watermark = MIN_TIMESTAMP
        self._heaps: dict[str, list[tuple[int, int, Any]]] = {EVENT: [], PROCESSING: []}
        self._seq = itertools.count()
        self.pctx = ProcessContext(self)

    def add_timer(self, key: Any, domain: str, ts: int) -> None:
        """Register a timer (once per key, domain and time)."""
        timers: list[list[Any]] = self.timer_table[self.shard(key)].setdefault(key, [])
        if [ts, domain] not in timers:
            timers.append([ts, domain])
            heapq.heappush(self._heaps[domain], (ts, next(self._seq), key))

    def delete_timer(self, key: Any, domain: str, ts: int) -> None:
        """Remove a timer; its heap entry is skipped when it comes up."""
        d = self.timer_table[self.shard(key)]
        timers = d.get(key, [])
        if [ts, domain] in timers:
            timers.remove([ts, domain])
            if not timers:
                del d[key]

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Call `process` for every record with its key bound (`process_broadcast`, without a key, for
        a broadcast input's); outputs keep the record's timestamp and mark."""
        ctx, key_fn = self.pctx, self.key_fns[input_index]
        ctx.input = self.inputs[input_index]
        broadcast = input_index in self.broadcast_inputs
        call = self.fn.process_broadcast if broadcast else self.fn.process
        timestamps, marks, watermark = batch.timestamps, batch.marks, self.watermark
        produced: list[list[Any]] = []
        for i, record in enumerate(batch.records):
            ts = timestamps[i] if timestamps is not None else None
            mark = late_reference(marks, i, watermark)
            try:
                if broadcast:
                    ctx.bind_broadcast(ts, mark)
                else:
                    key = key_fn(record)
                    if self.ttl is not None:
                        self._refresh(key, mark, ts)
                    ctx.bind(key, ts, mark)
                produced.append(list(call(record, ctx) or ()))
            except Exception as exc:
                self.dead.put(record, exc, ts, mark)
                produced.append([])
        return batch.spread(produced)

    def _refresh(self, key: Any, mark: int, ts: int | None) -> None:
        """A record of `key` came: forget the key's state if its TTL ran out by the record's mark (or the
        wall clock), then count the TTL from the record's timestamp (or the wall clock)."""
        now = self.ctx.clock()
        self._expire(key, mark if self.ttl_event else now)
        touched = self.touched[self.shard(key)]
        at = ts if self.ttl_event and ts is not None else now
        touched[key] = max(touched.get(key, at), at)

    def _expire(self, key: Any, now: int) -> None:
        """Forget `key`'s state (not its timers) when its TTL ran out by `now`."""
        assert self.ttl is not None
        shard = self.shard(key)
        last = self.touched[shard].get(key)
        if last is not None and last + self.ttl <= now:
            del self.touched[shard][key]
            self.states[shard].pop(key, None)

    def snapshot(self) -> dict[str, Any]:
        """The state, without the keys whose TTL ran out by the watermark (or the wall clock): every
        later record of theirs would forget them (its mark is at least this watermark)."""
        if self.ttl is not None:
            now = self.watermark if self.ttl_event else self.ctx.clock()
            for keys in self.touched.values():
                for key in [k for k, last in keys.items() if last + self.ttl <= now]:
                    self._expire(key, now)
        return super().snapshot()

    def _fire(self, domain: str, until: int) -> Batch | None:
        heap = self._heaps[domain]
        out: list[Any] = []
        stamps: list[int] = []
        on_timer = getattr(self.fn, "on_timer", None)
        while heap and heap[0][0] <= until:
            ts, _, key = heapq.heappop(heap)
            d = self.timer_table[self.shard(key)]
            timers = d.get(key, [])
            if [ts, domain] not in timers:
                continue
            timers.remove([ts, domain])
            if not timers:
                del d[key]
            if on_timer is not None:
                if self.ttl is not None:
                    event_now = ts if domain == EVENT else self.watermark
                    self._expire(key, event_now if self.ttl_event else self.ctx.clock())
                self.pctx.input = None
                self.pctx.bind(key, ts, ts if domain == EVENT else self.watermark)
                for record in on_timer(ts, self.pctx) or ():
                    out.append(record)
                    stamps.append(ts)
        return Batch(out, stamps) if out else None

    def on_watermark(self, watermark: int) -> Batch | None:
        """Fire event-time timers up to the watermark."""
        self.watermark = max(self.watermark, watermark)
        return self._fire(EVENT, watermark)

    def on_processing_time(self, now: int) -> Batch | None:
        """Fire processing-time timers up to now."""
        return self._fire(PROCESSING, now)

    def on_end(self) -> Batch | None:
        """Nothing more: event timers have fired with the final watermark."""
        return None

    def timers(self) -> int:
        """Timers set, of both domains."""
        return sum(len(heap) for heap in self._heaps.values())

    def operator_state(self) -> dict[str, Any]:
        """The watermark, and the broadcast state (every subtask holds the same; a subtask a rescale
        adds takes subtask 0's)."""
        return {**super().operator_state(), "broadcast": self.broadcast}

    def restore_operator_state(self, state: dict[str, Any]) -> None:
        """Load the broadcast state, the watermark and the timers."""
        self.broadcast = {name: dict(entries) for name, entries in state.get("broadcast", {}).items()}
        super().restore_operator_state(state)

    def rebuild_timers(self) -> None:
        """Rebuild the timer heaps from the restored timers."""
        self._heaps = {EVENT: [], PROCESSING: []}
        for key, timers in self.ctx.keyed().items("timers"):
            for ts, domain in timers:
                heapq.heappush(self._heaps[domain], (int(ts), next(self._seq), key))
