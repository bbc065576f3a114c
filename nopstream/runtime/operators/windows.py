"""The window operator family: tumbling, sliding and session windows, one implementation.

Per key, state holds the key's open windows as `[start, end, accumulator, fired]`.
Event time: a window fires when the watermark reaches `end - 1`; with allowed
lateness it stays until `end - 1 + lateness`, and each record that arrives in that
time fires it again with the updated result. A record is late, judged against its
mark (`records.late_reference`: its split's watermark when it was read), when its
windows are all past their lateness by it, or, in a session window, when its own
timestamp is (`ts + lateness <= mark`: a record behind the mark could join a session
that fired already, or not, by timing); a late record goes to the side output
`lateOutput` (or is dropped). Without allowed lateness, every window then fires once
with exactly the records that are not late, whatever the timing (docs/time.md).
Processing time: a record belongs to the windows of its arrival time, and windows
fire when the wall clock passes their end. Sessions merge overlapping windows.
At end of input every open window fires. Results are
`{"key", "start", "end", "value"}` with event timestamp `end - 1`; `value` is the
aggregate's result, or `fn(key, records)` for a window function.
Timers are derived from the windows in state, so they are part of every snapshot.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from nopstream.records import MIN_TIMESTAMP, Batch, late_reference
from nopstream.runtime.functions import resolve
from nopstream.runtime.keyed import hashable_key, key_function
from nopstream.runtime.operators.aggregates import aggregator, output_key
from nopstream.runtime.operators.base import Context, DeadLetters, KeyedOperator

START, END, ACC, FIRED = range(4)


def assign(kind: str, size: int, slide: int, gap: int, ts: int) -> list[tuple[int, int]]:
    """The windows `[start, end)` a timestamp falls in."""
    if kind == "tumbling":
        start = ts - ts % size
        return [(start, start + size)]
    if kind == "sliding":
        last = ts - ts % slide
        return [(s, s + size) for s in range(last, ts - size, -slide)]
    return [(ts, ts + gap)]


def _find(windows: list[list[Any]], start: int, end: int) -> list[Any] | None:
    """The window `[start, end)` among a key's open windows, if it is open."""
    return next((w for w in windows if w[START] == start and w[END] == end), None)


class _Records:
    """The accumulator of a window function: the window's records, in arrival order."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def create(self) -> list[Any]:
        return []

    def add(self, acc: list[Any], record: Any) -> list[Any]:
        acc.append(record)
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a + b

    def result_for(self, key: Any, acc: list[Any]) -> Any:
        return self.fn(output_key(key), acc)


class Window(KeyedOperator):
    """Keyed windows with event- or processing-time triggers."""

    def __init__(self, ctx: Context) -> None:
        """Read the window spec and prepare state and timers."""
        self.ctx = ctx
        spec = ctx.node.spec
        w = spec["window"]
        self.kind = w["kind"]
        self.event_time = w["time"] == "event"
        self.size = int(w.get("sizeMs") or 0)
        self.slide = int(w.get("slideMs") or 0)
        self.gap = int(w.get("gapMs") or 0)
        self.lateness = int(w.get("allowedLatenessMs", 0)) if self.event_time else 0
        self.late_tag = w.get("lateOutput")
        self.records = _Records(resolve(spec["fn"])) if "fn" in spec else None
        self.agg = aggregator(spec["aggregate"]) if "aggregate" in spec else None
        self.key_fn = key_function(ctx.node.key)  # type: ignore[arg-type]
        self.dead = DeadLetters(ctx.node, ctx.side)
        self.table = ctx.keyed().table("windows")
        self.shard = ctx.shard_cache.shard
        self.watermark = MIN_TIMESTAMP
        self._timers: list[tuple[int, int, str, Any, int, int]] = []
        self._seq = itertools.count()

    # --- assignment ---------------------------------------------------------------------

    def assign(self, ts: int) -> list[tuple[int, int]]:
        """The windows a timestamp falls in."""
        return assign(self.kind, self.size, self.slide, self.gap, ts)

    def _acc(self) -> Any:
        return self.agg if self.agg is not None else self.records

    def _result(self, key: Any, acc: Any) -> Any:
        if self.agg is not None:
            return self.agg.result(acc)
        assert self.records is not None
        return self.records.result_for(key, acc)

    # --- input -----------------------------------------------------------------------------

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Add each record to its windows; late ones go to the side output."""
        out: list[Any] = []
        stamps: list[int] = []
        late: list[int] = []
        now = self.ctx.clock()
        timestamps = batch.timestamps if self.event_time else None
        if self.event_time and timestamps is None:
            raise RuntimeError(f"event-time window '{self.ctx.node.node_id}' got records without timestamps")
        marks, watermark = batch.marks, self.watermark
        for i, record in enumerate(batch.records):
            ts = timestamps[i] if timestamps is not None else now
            mark = late_reference(marks, i, watermark)
            try:
                added = self._add(self.key_fn(record), ts, mark, record, out, stamps)
            except Exception as exc:
                self.dead.put(record, exc, ts, mark)
                continue
            if not added:
                late.append(i)
        if late and self.late_tag is not None:
            self.ctx.side(self.late_tag, batch.pick(late))
        return Batch(out, stamps)

    def _add(self, key: Any, ts: int, mark: int, record: Any, out: list[Any], stamps: list[int]) -> bool:
        """Add a record to its windows; False when it is late by `mark`."""
        if self.kind == "session":
            if self.event_time and ts + self.lateness <= mark:
                return False
            windows = self.assign(ts)
        else:
            windows = [w for w in self.assign(ts) if not self._expired(w[1], mark)]
            if not windows:
                return False
        d = self.table[self.shard(key)]
        open_windows: list[list[Any]] = d.setdefault(key, [])
        acc = self._acc()
        for start, end in windows:
            if self.kind == "session":
                target = self._merge_session(key, open_windows, start, end, acc, record)
            else:
                found = _find(open_windows, start, end)
                if found is None:
                    found = [start, end, acc.create(), False]
                    open_windows.append(found)
                    self._schedule(key, found)
                found[ACC] = acc.add(found[ACC], record)
                target = found
            if target[FIRED] or (self.event_time and target[END] - 1 <= self.watermark):
                # a record within the allowed lateness fires its (already due) window again
                self._emit(key, target, out, stamps)
                target[FIRED] = True
        return True

    def merge_partials(self, batch: Batch) -> None:
        """Fold `[key, start, end, partial]` of upstream combiners (`runtime.combiner`) into the windows.

        Only tumbling and sliding event-time aggregates without lateness are combined:
        a partial of a window the watermark has passed is late, and dropped, as each of
        its records would have been; no window fires here (the watermark fires them).
        """
        assert self.agg is not None
        merge = self.agg.merge
        for key, start, end, partial in batch.records:
            if self._expired(end, self.watermark):
                continue
            k = hashable_key(key)
            open_windows: list[list[Any]] = self.table[self.shard(k)].setdefault(k, [])
            target = _find(open_windows, start, end)
            if target is None:
                open_windows.append([start, end, partial, False])
                self._schedule(k, open_windows[-1])
            else:
                target[ACC] = merge(target[ACC], partial)

    def _merge_session(
        self, key: Any, sessions: list[list[Any]], start: int, end: int, acc: Any, record: Any
    ) -> list[Any]:
        merged = [start, end, acc.add(acc.create(), record), False]
        for s in [s for s in sessions if s[START] < end and start < s[END]]:
            sessions.remove(s)
            merged[START] = min(merged[START], s[START])
            merged[END] = max(merged[END], s[END])
            merged[ACC] = acc.merge(s[ACC], merged[ACC])
            merged[FIRED] = merged[FIRED] or s[FIRED]
        sessions.append(merged)
        self._schedule(key, merged)
        return merged

    def _expired(self, end: int, mark: int) -> bool:
        """Whether a window ending at `end` is past its lateness at event time `mark`."""
        return self.event_time and end - 1 + self.lateness <= mark

    # --- timers --------------------------------------------------------------------------

    def _schedule(self, key: Any, window: list[Any]) -> None:
        fire_at = window[END] - 1 if self.event_time else window[END]
        heapq.heappush(self._timers, (fire_at, next(self._seq), "fire", key, window[START], window[END]))
        if self.lateness:
            heapq.heappush(
                self._timers,
                (fire_at + self.lateness, next(self._seq), "purge", key, window[START], window[END]),
            )

    def _due(self, time: int) -> Batch | None:
        out: list[Any] = []
        stamps: list[int] = []
        timers = self._timers
        while timers and timers[0][0] <= time:
            _, _, what, key, start, end = heapq.heappop(timers)
            d = self.table[self.shard(key)]
            windows = d.get(key, [])
            window = _find(windows, start, end)
            if window is None:
                continue
            if what == "fire" and not window[FIRED]:
                self._emit(key, window, out, stamps)
                window[FIRED] = True
            if what == "purge" or not self.lateness:
                windows.remove(window)
                if not windows:
                    del d[key]
        return Batch(out, stamps) if out else None

    def _emit(self, key: Any, window: list[Any], out: list[Any], stamps: list[int]) -> None:
        out.append(
            {
                "key": output_key(key),
                "start": window[START],
                "end": window[END],
                "value": self._result(key, window[ACC]),
            }
        )
        stamps.append(window[END] - 1)

    def on_watermark(self, watermark: int) -> Batch | None:
        """Fire event-time windows that are due."""
        if watermark <= self.watermark:
            return None
        self.watermark = watermark
        return self._due(watermark) if self.event_time else None

    def on_processing_time(self, now: int) -> Batch | None:
        """Fire processing-time windows that are due."""
        return None if self.event_time else self._due(now)

    def on_end(self) -> Batch | None:
        """Fire every window that has not fired."""
        out: list[Any] = []
        stamps: list[int] = []
        for key, windows in sorted(self.ctx.keyed().items("windows"), key=lambda kv: repr(kv[0])):
            for window in sorted(windows, key=lambda w: (w[START], w[END])):
                if not window[FIRED]:
                    self._emit(key, window, out, stamps)
                    window[FIRED] = True
        return Batch(out, stamps) if out else None

    # --- snapshots -------------------------------------------------------------------------

    def timers(self) -> int:
        """Timers set: a window's firing, and its purge once lateness is past."""
        return len(self._timers)

    def rebuild_timers(self) -> None:
        """Rebuild the timers from the restored windows."""
        self._timers = []
        for key, windows in self.ctx.keyed().items("windows"):
            for window in windows:
                self._schedule(key, window)
