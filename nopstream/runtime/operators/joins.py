"""Joins of two keyed inputs in event time: interval, window and temporal (docs/joins.md).

Input 0 is the left, input 1 the right; each is keyed by its own selector (`keys`) or
by the one `key`, into one key space. A record is late when its timestamp is at or
behind its mark (`records.late_reference`; in a tumbling or sliding window join, when
every window it falls in ends at or behind it); late records join nothing and go to
`join.lateOutput` (or are dropped). Every other record arrives before the watermark
that would expire its partners, so which rows a join emits depends on the data only,
not on timing or parallelism (docs/time.md).

A joined row is `fn(left, right)` when the operator names `fn` (the missing side of an
outer row is None), else `{"key", "left", "right"}`, with `"start"` and `"end"` in a
window join; a semi or anti join emits the left record itself (or `fn(left, None)`).
State lives in the keyed state of each key's shard and timers are derived from it, so
snapshots hold both; what can no longer match is dropped as the watermark passes it.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable
from typing import Any

from nopstream.records import MIN_TIMESTAMP, Batch, late_reference
from nopstream.runtime.functions import resolve
from nopstream.runtime.operators.aggregates import output_key
from nopstream.runtime.operators.base import Context, DeadLetters, KeyedOperator
from nopstream.runtime.operators.windows import assign

LEFT, RIGHT = 0, 1
TS, RECORD, MATCHED = range(3)
START, END, LEFTS, RIGHTS = range(4)


class _Join(KeyedOperator):
    """What every join shares: keys per input, lateness, the output row, timers by watermark."""

    def __init__(self, ctx: Context) -> None:
        """Read the join spec and prepare the key functions and timers."""
        self.ctx = ctx
        self.spec: dict[str, Any] = ctx.node.spec["join"]
        self.how: str = self.spec.get("how", "inner")
        self.late_tag: str | None = self.spec.get("lateOutput")
        self.fn: Callable[[Any, Any], Any] | None = (
            resolve(ctx.node.spec["fn"]) if "fn" in ctx.node.spec else None
        )
        self.key_fns = ctx.key_fns()
        self.dead = DeadLetters(ctx.node, ctx.side)
        self.shard = ctx.shard_cache.shard
        self.watermark = MIN_TIMESTAMP
        self._timers: list[tuple[Any, ...]] = []
        self._seq = itertools.count()

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Join each record with what the other input holds; late ones go to the side output."""
        if batch.timestamps is None:
            raise RuntimeError(f"join '{self.ctx.node.node_id}' got records without timestamps")
        out: list[Any] = []
        stamps: list[int] = []
        late: list[int] = []
        key_fn, marks, watermark = self.key_fns[input_index], batch.marks, self.watermark
        for i, (record, ts) in enumerate(zip(batch.records, batch.timestamps, strict=True)):
            mark = late_reference(marks, i, watermark)
            try:
                added = self.add(input_index, key_fn(record), ts, mark, record, out, stamps)
            except Exception as exc:
                self.dead.put(record, exc, ts, mark)
                continue
            if not added:
                late.append(i)
        if late and self.late_tag is not None:
            self.ctx.side(self.late_tag, batch.pick(late))
        return Batch(out, stamps)

    def add(
        self, side: int, key: Any, ts: int, mark: int, record: Any, out: list[Any], stamps: list[int]
    ) -> bool:
        """Hold a record of `side` and emit what it joins now; False when it is late by `mark`."""
        raise NotImplementedError

    def row(self, key: Any, left: Any, right: Any) -> Any:
        """The joined output of a left and a right record (either None in an outer row)."""
        if self.fn is not None:
            return self.fn(left, right)
        if self.how in ("semi", "anti"):
            return left
        return {"key": output_key(key), "left": left, "right": right}

    def on_watermark(self, watermark: int) -> Batch | None:
        """Emit and drop what the watermark has passed."""
        if watermark <= self.watermark:
            return None
        self.watermark = watermark
        out: list[Any] = []
        stamps: list[int] = []
        self.due(watermark, out, stamps)
        return Batch(out, stamps) if out else None

    def due(self, watermark: int, out: list[Any], stamps: list[int]) -> None:
        """Fire the timers at or before `watermark`."""
        raise NotImplementedError

    def on_end(self) -> Batch | None:
        """Nothing more: the final watermark emitted and dropped everything."""
        return None

    def timers(self) -> int:
        """Timers set: one per record held (its expiry, or its firing)."""
        return len(self._timers)

    def _push(self, at: int, *what: Any) -> None:
        heapq.heappush(self._timers, (at, next(self._seq), *what))

    def _pop_due(self, watermark: int) -> list[tuple[Any, ...]]:
        """The timers at or before `watermark`, in time order, without their time and sequence."""
        timers, due = self._timers, []
        while timers and timers[0][0] <= watermark:
            due.append(heapq.heappop(timers)[2:])
        return due


class IntervalJoin(_Join):
    """Pairs left and right records of a key with `lowerMs <= right.ts - left.ts <= upperMs`.

    Each side holds a key's records as `[ts, record, matched]` until the watermark
    passes the last time a partner could have: `ts + upperMs` for a left record,
    `ts - lowerMs` for a right one. A pair is emitted when its second record arrives,
    at the later of the two timestamps; a record that leaves unmatched is emitted then,
    at its own timestamp, by a left, right, full or anti join. Those rows are behind
    the watermark, so such a join holds the watermark it passes on back by
    `max(upperMs, -lowerMs, 0)`, as Flink's SQL interval join does.
    """

    def __init__(self, ctx: Context) -> None:
        """Read the bounds and prepare both sides' tables."""
        super().__init__(ctx)
        self.lower = int(self.spec["lowerMs"])
        self.upper = int(self.spec["upperMs"])
        self.sides = (ctx.keyed().table("left"), ctx.keyed().table("right"))
        self.unmatched_out = (self.how in ("left", "full", "anti"), self.how in ("right", "full"))
        self.watermark_delay = 0 if self.how == "inner" else max(self.upper, -self.lower, 0)

    def _expiry(self, side: int, ts: int) -> int:
        return ts + self.upper if side == LEFT else ts - self.lower

    def add(
        self, side: int, key: Any, ts: int, mark: int, record: Any, out: list[Any], stamps: list[int]
    ) -> bool:
        """Pair the record with the other side's in its interval, then hold it until it expires."""
        if ts <= mark:
            return False
        entry = [ts, record, False]
        shard = self.shard(key)
        for other in self.sides[1 - side][shard].get(key, ()):
            gap = other[TS] - ts if side == LEFT else ts - other[TS]
            if not self.lower <= gap <= self.upper:
                continue
            left, right = (entry, other) if side == LEFT else (other, entry)
            if self.how == "semi":
                if not left[MATCHED]:
                    out.append(self.row(key, left[RECORD], None))
                    stamps.append(left[TS])
            elif self.how != "anti":
                out.append(self.row(key, left[RECORD], right[RECORD]))
                stamps.append(max(ts, other[TS]))
            left[MATCHED] = right[MATCHED] = True
        self.sides[side][shard].setdefault(key, []).append(entry)
        self._push(self._expiry(side, ts), side, key)
        return True

    def due(self, watermark: int, out: list[Any], stamps: list[int]) -> None:
        """Drop the records no partner can reach any more, emitting the unmatched ones an outer join keeps."""
        for side, key in self._pop_due(watermark):
            d = self.sides[side][self.shard(key)]
            entries = d.get(key)
            if entries is None:
                continue
            kept = []
            for e in entries:
                if self._expiry(side, e[TS]) > watermark:
                    kept.append(e)
                elif self.unmatched_out[side] and not e[MATCHED]:
                    out.append(
                        self.row(key, e[RECORD], None) if side == LEFT else self.row(key, None, e[RECORD])
                    )
                    stamps.append(e[TS])
            if kept:
                d[key] = kept
            else:
                del d[key]

    def rebuild_timers(self) -> None:
        """One expiry per held record, from the restored tables."""
        self._timers = []
        for side, name in ((LEFT, "left"), (RIGHT, "right")):
            for key, entries in self.ctx.keyed().items(name):
                for e in entries:
                    self._push(self._expiry(side, e[TS]), side, key)


FIRE, PRUNE = 0, 1


class TemporalJoin(_Join):
    """Joins each left record with the right record of its key valid at its timestamp (an as-of join).

    The right input is a versioned table: each record is the version of its key (the
    table's primary key) from its timestamp on, kept as `[ts, record]` in timestamp
    order. A left record waits until the watermark reaches its timestamp, when every
    version at or before it has arrived, and joins the latest of them (an inner join
    drops it when there is none; a left join emits it with None). Versions a later
    left record can no longer pick (older than the latest at or before the watermark)
    are dropped. Two versions of a key with equal timestamps apply in arrival order:
    deterministic when they come from one split. With `stateTtlMs`, a version is valid for
    at most that long after its timestamp, and dropped once the watermark is past that.
    """

    def __init__(self, ctx: Context) -> None:
        """Prepare the versions and the waiting left records."""
        super().__init__(ctx)
        self.versions = ctx.keyed().table("versions")
        self.waiting = ctx.keyed().table("waiting")
        ttl = ctx.node.spec.get("stateTtlMs")
        self.ttl: int | None = int(ttl) if ttl is not None else None

    def add(
        self, side: int, key: Any, ts: int, mark: int, record: Any, out: list[Any], stamps: list[int]
    ) -> bool:
        """Hold a left record until the watermark reaches it; add a right record as a version."""
        if ts <= mark:
            return False
        shard = self.shard(key)
        if side == LEFT:
            self.waiting[shard].setdefault(key, []).append([ts, record])
            self._push(ts, FIRE, key)
        else:
            versions: list[list[Any]] = self.versions[shard].setdefault(key, [])
            versions.insert(bisect.bisect_right(versions, ts, key=lambda v: v[TS]), [ts, record])
            self._push(ts, PRUNE, key)
            if self.ttl is not None:
                self._push(ts + self.ttl, PRUNE, key)
        return True

    def due(self, watermark: int, out: list[Any], stamps: list[int]) -> None:
        """Join the left records the watermark reached, then drop the versions nothing can pick."""
        due = self._pop_due(watermark)
        for what, key in due:
            if what == FIRE:
                self._fire(key, watermark, out, stamps)
        for what, key in due:
            if what == PRUNE:
                self._prune(key, watermark)

    def _fire(self, key: Any, watermark: int, out: list[Any], stamps: list[int]) -> None:
        shard = self.shard(key)
        waiting = self.waiting[shard].get(key)
        if waiting is None:
            return
        versions = self.versions[shard].get(key, [])
        for ts, record in sorted((w for w in waiting if w[TS] <= watermark), key=lambda w: w[TS]):
            at = bisect.bisect_right(versions, ts, key=lambda v: v[TS])
            if at and (self.ttl is None or versions[at - 1][TS] + self.ttl > ts):
                out.append(self.row(key, record, versions[at - 1][RECORD]))
            elif self.how == "left":
                out.append(self.row(key, record, None))
            else:
                continue
            stamps.append(ts)
        rest = [w for w in waiting if w[TS] > watermark]
        if rest:
            self.waiting[shard][key] = rest
        else:
            del self.waiting[shard][key]

    def _prune(self, key: Any, watermark: int) -> None:
        d = self.versions[self.shard(key)]
        versions = d.get(key)
        if versions:
            at = bisect.bisect_right(versions, watermark, key=lambda v: v[TS])
            if at > 1:
                del versions[: at - 1]
            if self.ttl is not None and versions[0][TS] + self.ttl <= watermark:
                del versions[0]  # expired: no left record after the watermark may pick it
            if not versions:
                del d[key]

    def rebuild_timers(self) -> None:
        """A firing per waiting left record and a pruning per version, from the restored tables."""
        self._timers = []
        for key, waiting in self.ctx.keyed().items("waiting"):
            for w in waiting:
                self._push(w[TS], FIRE, key)
        for key, versions in self.ctx.keyed().items("versions"):
            for v in versions:
                self._push(v[TS], PRUNE, key)
                if self.ttl is not None:
                    self._push(v[TS] + self.ttl, PRUNE, key)


class WindowJoin(_Join):
    """Joins the left and right records of a key that fall in the same window (tumbling, sliding, session).

    A key's windows are held as `[start, end, lefts, rights]`; a window joins once,
    when the watermark reaches `end - 1`, and is dropped: every pair (inner), plus each
    record without a partner in the window (left, right, full), or each left record
    once when the window has any right one (semi) or none (anti). Rows carry the
    window's `end - 1`. Sessions merge across both inputs. Late, in a tumbling or
    sliding window join, means every window of the record ends at or behind its mark;
    in a session window join, a timestamp at or behind its mark.
    """

    def __init__(self, ctx: Context) -> None:
        """Read the window and prepare the windows table."""
        super().__init__(ctx)
        w = self.spec["window"]
        self.kind = w["kind"]
        self.size = int(w.get("sizeMs") or 0)
        self.slide = int(w.get("slideMs") or 0)
        self.gap = int(w.get("gapMs") or 0)
        self.table = ctx.keyed().table("windows")

    def add(
        self, side: int, key: Any, ts: int, mark: int, record: Any, out: list[Any], stamps: list[int]
    ) -> bool:
        """Add the record to each of its windows the watermark cannot have passed."""
        if self.kind == "session":
            if ts <= mark:
                return False
            self._merge_session(key, side, ts, record)
            return True
        windows = [(s, e) for s, e in assign(self.kind, self.size, self.slide, self.gap, ts) if e - 1 > mark]
        if not windows:
            return False
        open_windows: list[list[Any]] = self.table[self.shard(key)].setdefault(key, [])
        for start, end in windows:
            found = next((w for w in open_windows if w[START] == start and w[END] == end), None)
            if found is None:
                found = [start, end, [], []]
                open_windows.append(found)
                self._push(end - 1, key, start, end)
            found[LEFTS if side == LEFT else RIGHTS].append(record)
        return True

    def _merge_session(self, key: Any, side: int, ts: int, record: Any) -> None:
        sessions: list[list[Any]] = self.table[self.shard(key)].setdefault(key, [])
        merged: list[Any] = [ts, ts + self.gap, [], []]
        merged[LEFTS if side == LEFT else RIGHTS].append(record)
        for s in [s for s in sessions if s[START] < merged[END] and merged[START] < s[END]]:
            sessions.remove(s)
            merged[START] = min(merged[START], s[START])
            merged[END] = max(merged[END], s[END])
            merged[LEFTS] = s[LEFTS] + merged[LEFTS]
            merged[RIGHTS] = s[RIGHTS] + merged[RIGHTS]
        sessions.append(merged)
        self._push(merged[END] - 1, key, merged[START], merged[END])

    def due(self, watermark: int, out: list[Any], stamps: list[int]) -> None:
        """Join and drop each window the watermark reached."""
        for key, start, end in self._pop_due(watermark):
            d = self.table[self.shard(key)]
            windows = d.get(key, [])
            window = next((w for w in windows if w[START] == start and w[END] == end), None)
            if window is None:  # merged into a longer session since
                continue
            windows.remove(window)
            if not windows:
                del d[key]
            rows = self._rows(key, window)
            out.extend(rows)
            stamps.extend([end - 1] * len(rows))

    def _rows(self, key: Any, window: list[Any]) -> list[Any]:
        lefts, rights, how = window[LEFTS], window[RIGHTS], self.how
        if how == "semi":
            return [self.row(key, left, None) for left in lefts] if rights else []
        if how == "anti":
            return [] if rights else [self.row(key, left, None) for left in lefts]
        rows = [self._windowed(key, window, left, right) for left in lefts for right in rights]
        if how in ("left", "full") and not rights:
            rows += [self._windowed(key, window, left, None) for left in lefts]
        if how in ("right", "full") and not lefts:
            rows += [self._windowed(key, window, None, right) for right in rights]
        return rows

    def _windowed(self, key: Any, window: list[Any], left: Any, right: Any) -> Any:
        if self.fn is not None:
            return self.fn(left, right)
        return {
            "key": output_key(key),
            "start": window[START],
            "end": window[END],
            "left": left,
            "right": right,
        }

    def rebuild_timers(self) -> None:
        """A firing per open window, from the restored windows."""
        self._timers = []
        for key, windows in self.ctx.keyed().items("windows"):
            for w in windows:
                self._push(w[END] - 1, key, w[START], w[END])


def join(ctx: Context) -> _Join:
    """The join operator of the node's `join.kind`."""
    kinds: dict[str, type[_Join]] = {"interval": IntervalJoin, "temporal": TemporalJoin, "window": WindowJoin}
    return kinds[ctx.node.spec["join"]["kind"]](ctx)
