"""Event time: watermark generation at sources and combination over input channels.

Each source split (a file stripe, a Kafka partition) has its own watermark: the highest
timestamp read in it minus the allowed out-of-orderness, minus 1 (a record of the same
millisecond as the highest is not late). Every record is marked with
its split's watermark just before it (`Batch.marks`), and operators judge it late
against that mark, so what is late depends on the split's data alone. A source
subtask's watermark is the lowest over its splits that may still give records (a split
not begun holds it at the minimum), so no record comes after a watermark it is not
late for; a source with no data for its idle timeout marks itself idle (then lateness
depends on timing: docs/time.md).
A task's input watermark is the minimum over its channels that are neither idle nor
ended; it only moves forward. Per-channel watermarks are part of task snapshots.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import Any

from nopstream.records import MAX_TIMESTAMP, MIN_TIMESTAMP
from nopstream.runtime.functions import resolve


def timestamp_function(watermark_spec: dict[str, Any]) -> Callable[[Any], int] | None:
    """The function that reads a record's event timestamp (ms) under a watermark spec; None when the
    source's reader gives each record its timestamp (a Kafka record's)."""
    field = watermark_spec.get("timestampField")
    if field is not None:
        return lambda record: int(record[field])
    if watermark_spec.get("timestampFn") is None:
        return None
    fn = resolve(watermark_spec["timestampFn"])
    return lambda record: int(fn(record))


class WatermarkGenerator:
    """Bounded out-of-orderness watermarks with an idle timeout, for one source subtask."""

    def __init__(self, spec: dict[str, Any], clock: Callable[[], int]) -> None:
        """Generate by `spec` (`maxOutOfOrdernessMs`, `idleTimeoutMs`), timing idleness with `clock`."""
        # a watermark W says no record at or before W is still to come: the split's highest
        # timestamp minus the allowed out-of-orderness, minus 1, so that a record of the same
        # millisecond as the highest is not late (Flink's BoundedOutOfOrdernessWatermarks)
        self.delay = int(spec.get("maxOutOfOrdernessMs", 0)) + 1
        self.idle_timeout = spec.get("idleTimeoutMs")
        self.clock = clock
        self.max_seen = MIN_TIMESTAMP
        self.emitted = MIN_TIMESTAMP
        self.idle = False
        self._last_data = clock()

    def observe(self, timestamps: list[int], highs: list[int] | None = None) -> list[int]:
        """Records with these timestamps were read; each one's mark (its split's watermark before it).

        `highs`: each record's split high before it, from a reader that follows its
        splits (`SplitEventTime`); without, the subtask's records are one split.
        """
        if not timestamps:
            return []
        if highs is None:
            highs = list(accumulate(timestamps, max, initial=self.max_seen))[:-1]
        self.max_seen = max(self.max_seen, max(timestamps))
        self._last_data = self.clock()
        self.idle = False
        delay = self.delay
        lowest = MIN_TIMESTAMP + delay  # a high below it has no watermark yet (and must not underflow)
        return [h - delay if h >= lowest else MIN_TIMESTAMP for h in highs]

    def due(self, floor: int | None = None) -> tuple[int, bool] | None:
        """(watermark, idle) to emit now, or None when nothing changed; `floor` holds the watermark
        back to the slowest split of a reader that follows its splits (`SplitEventTime`)."""
        if self.max_seen != MIN_TIMESTAMP:
            wm = (self.max_seen if floor is None else min(self.max_seen, floor)) - self.delay
            if wm > self.emitted:
                self.emitted = wm
                return wm, False
        if (
            self.idle_timeout is not None
            and not self.idle
            and self.clock() - self._last_data >= int(self.idle_timeout)
        ):
            self.idle = True
            return self.emitted, True
        return None

    def snapshot(self) -> dict[str, int]:
        """The generator's progress."""
        return {"maxSeen": self.max_seen, "emitted": self.emitted}

    def restore(self, state: dict[str, int]) -> None:
        """Resume from a snapshot."""
        self.max_seen = int(state["maxSeen"])
        self.emitted = int(state["emitted"])


class InputWatermarks:
    """The watermark of each input channel and their combination."""

    def __init__(self, channel_ids: list[str]) -> None:
        """Every channel starts at the minimum timestamp, active."""
        self.marks = dict.fromkeys(channel_ids, MIN_TIMESTAMP)
        self.idle: set[str] = set()
        self.ended: set[str] = set()
        self.current = MIN_TIMESTAMP

    def update(self, channel_id: str, timestamp: int, *, idle: bool = False) -> int | None:
        """A watermark arrived on a channel; the new combined watermark if it advanced."""
        if idle:
            self.idle.add(channel_id)
        else:
            self.idle.discard(channel_id)
            if timestamp > self.marks[channel_id]:
                self.marks[channel_id] = timestamp
        return self._advance()

    def activity(self, channel_id: str) -> None:
        """Records arrived on a channel: it is no longer idle."""
        self.idle.discard(channel_id)

    def end(self, channel_id: str) -> int | None:
        """A channel ended; it no longer holds event time back."""
        self.ended.add(channel_id)
        self.marks[channel_id] = MAX_TIMESTAMP
        return self._advance()

    def _advance(self) -> int | None:
        active = [m for c, m in self.marks.items() if c not in self.idle]
        if not active:
            return None
        combined = min(active)
        if combined > self.current:
            self.current = combined
            return combined
        return None

    def snapshot(self) -> dict[str, Any]:
        """Per-channel watermarks, idleness and the combined watermark."""
        return {"channels": dict(self.marks), "idle": sorted(self.idle), "current": self.current}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from a snapshot (channels unknown to this plan are ignored)."""
        for channel, mark in state.get("channels", {}).items():
            if channel in self.marks:
                self.marks[channel] = int(mark)
        self.current = int(state.get("current", MIN_TIMESTAMP))
