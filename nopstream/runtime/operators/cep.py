"""CEP: a keyed NFA over a pattern sequence that must complete `within` a time bound.

Pattern steps are tried in order. An event that matches step 0 starts a new partial
match (every such event does). A partial match waiting for step i takes an event
that matches step i and moves on; while the previous step is `oneOrMore`, events
that match it are added to it; with `strict` contiguity an event that matches
neither ends the partial match, with `relaxed` it is skipped. A partial match is
dropped when an event (or, in event time, the watermark) is more than `withinMs`
after its first event. A completed match is emitted as `{step name: [records]}`
with the timestamp of its last event.
Event time: events are buffered per key and processed in timestamp order once the
watermark passes them (all of them at end of input), so out-of-order input gives
the same matches as ordered input; an event at or below its mark (its split's
watermark when it was read, `records.late_reference`) is late and dropped (counted in
`late_dropped`), so which are late depends on the data alone. Partial matches and buffers
live in keyed state.
"""

from __future__ import annotations

from typing import Any

from nopstream.records import MIN_TIMESTAMP, Batch, late_reference
from nopstream.runtime.functions import resolve
from nopstream.runtime.keyed import key_function
from nopstream.runtime.operators.base import Context, DeadLetters, KeyedOperator

NEXT, MATCHED, FIRST_TS, LOOPING = range(4)


class Cep(KeyedOperator):
    """Matches a pattern per key."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the step conditions and prepare the state tables."""
        self.ctx = ctx
        pattern = ctx.node.spec["pattern"]
        self.steps = [
            (s["name"], resolve(s["where"]), s.get("contiguity", "relaxed"), s.get("quantifier", "one"))
            for s in pattern["steps"]
        ]
        self.within = int(pattern["withinMs"])
        self.event_time = pattern["time"] == "event"
        self.key_fn = key_function(ctx.node.key)  # type: ignore[arg-type]
        self.dead = DeadLetters(ctx.node, ctx.side)
        self.partials = ctx.keyed().table("partials")
        self.buffers = ctx.keyed().table("buffer")
        self.shard = ctx.shard_cache.shard
        self.watermark = MIN_TIMESTAMP
        self.late_dropped = 0

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Buffer events (event time) or match them at once (processing time)."""
        out: list[Any] = []
        stamps: list[int] = []
        if self.event_time:
            if batch.timestamps is None:
                raise RuntimeError(f"event-time cep '{self.ctx.node.node_id}' got records without timestamps")
            marks, watermark = batch.marks, self.watermark
            for i, (record, ts) in enumerate(zip(batch.records, batch.timestamps, strict=True)):
                mark = late_reference(marks, i, watermark)
                if ts <= mark:
                    self.late_dropped += 1
                    continue
                try:
                    key = self.key_fn(record)
                except Exception as exc:
                    self.dead.put(record, exc, ts, mark)
                    continue
                self.buffers[self.shard(key)].setdefault(key, []).append([ts, record])
            return Batch(out, stamps)
        now = self.ctx.clock()
        for record in batch.records:
            try:
                self._advance(self.key_fn(record), now, record, out, stamps)
            except Exception as exc:
                self.dead.put(record, exc)
        return Batch(out, stamps)

    def _advance(self, key: Any, ts: int, event: Any, out: list[Any], stamps: list[int]) -> None:
        d = self.partials[self.shard(key)]
        kept: list[list[Any]] = []
        for p in d.get(key, []):
            if ts - p[FIRST_TS] > self.within:
                continue
            if self._step(p, event):
                if p[NEXT] == len(self.steps):
                    out.append(p[MATCHED])
                    stamps.append(ts)
                else:
                    kept.append(p)
        name, where, _, quantifier = self.steps[0]
        if where(event):
            fresh = [1, {name: [event]}, ts, quantifier == "oneOrMore"]
            if len(self.steps) == 1:
                out.append(fresh[MATCHED])
                stamps.append(ts)
            else:
                kept.append(fresh)
        if kept:
            d[key] = kept
        else:
            d.pop(key, None)

    def _step(self, p: list[Any], event: Any) -> bool:
        """Feed one event to a partial match; False when the match breaks."""
        name, where, contiguity, quantifier = self.steps[p[NEXT]]
        if bool(where(event)):
            p[MATCHED][name] = [event]
            p[NEXT] += 1
            p[LOOPING] = quantifier == "oneOrMore"
            return True
        if p[LOOPING]:
            prev_name, prev_where, _, _ = self.steps[p[NEXT] - 1]
            if prev_where(event):
                p[MATCHED][prev_name].append(event)
                return True
        return bool(contiguity != "strict")

    def _drain(self, until: int) -> Batch | None:
        out: list[Any] = []
        stamps: list[int] = []
        for shard, d in self.buffers.items():
            for key in list(d):
                events = d[key]
                ready = sorted((e for e in events if e[0] <= until), key=lambda e: e[0])
                if not ready:
                    continue
                rest = [e for e in events if e[0] > until]
                if rest:
                    d[key] = rest
                else:
                    del d[key]
                for ts, record in ready:
                    self._advance(key, ts, record, out, stamps)
            self._expire(shard, until)
        return Batch(out, stamps) if out else None

    def _expire(self, shard: int, watermark: int) -> None:
        d = self.partials[shard]
        for key in list(d):
            alive = [p for p in d[key] if watermark - p[FIRST_TS] <= self.within]
            if alive:
                d[key] = alive
            else:
                del d[key]

    def on_watermark(self, watermark: int) -> Batch | None:
        """Match the buffered events the watermark has passed, in timestamp order."""
        self.watermark = max(self.watermark, watermark)
        return self._drain(watermark) if self.event_time else None

    def on_end(self) -> Batch | None:
        """Nothing more: buffered events were matched with the final watermark."""
        return None
