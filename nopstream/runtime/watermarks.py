"""Event time: watermark generation at sources and combination over input channels.

A source's watermark is the highest timestamp it has read minus the allowed
out-of-orderness (of its slowest split, for a reader that follows its splits' event
time); a source with no data for its idle timeout marks itself idle.
A task's input watermark is the minimum over its channels that are neither idle nor
ended; it only moves forward. Per-channel watermarks are part of task snapshots.
"""

from __future__ import annotations

from collections.abc import Callable
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
        self.delay = int(spec.get("maxOutOfOrdernessMs", 0))
        self.idle_timeout = spec.get("idleTimeoutMs")
        self.clock = clock
        self.max_seen = MIN_TIMESTAMP
        self.emitted = MIN_TIMESTAMP
        self.idle = False
        self._last_data = clock()

    def observe(self, timestamps: list[int]) -> None:
        """Records with these timestamps were read."""
        if timestamps:
            self.max_seen = max(self.max_seen, max(timestamps))
            self._last_data = self.clock()
            self.idle = False

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
