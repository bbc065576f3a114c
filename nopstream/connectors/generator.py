"""The `generator` and `collection` sources (REPLAYABLE): records by index, deterministic.

Split `split-n` of S produces the record indexes n, n+S, n+2S, ... below `count`
(forever when `count` is unset). A record depends only on its index, so a replay
from a cursor (the next index) gives the same records. Each split has its own event
time (`SplitEventTime`).

`generator` makes records from a seed: kinds `sequence` (the index), `words` (a line
of `wordsPerLine` words from a `vocabulary` of `w0`..`wN`), `events` (`{"key": "k{i mod
keys}", "value": i, "ts": 10 * i}`); `ratePerSecond` paces the whole source (each split
takes its share). `collection` reads the records its config lists (`nopstream.testing`).
"""

from __future__ import annotations

import time
from typing import Any

from nopstream.connectors.event_time import SplitHighs
from nopstream.model.connectors import CollectionSourceConfig, GeneratorSourceConfig
from nopstream.records import MIN_TIMESTAMP, Batch

_MASK = (1 << 64) - 1


def mix(x: int) -> int:
    """splitmix64: a fast, well-spread 64-bit mix."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class IndexedSource:
    """Reads the records of the splits assigned to one subtask, by index (`record`)."""

    def __init__(
        self,
        count: int | None,
        splits: tuple[str, ...],
        *,
        total_splits: int,
        rate_per_second: float | None = None,
    ) -> None:
        """Prepare the cursors of `splits` (`split-n` names) over indexes below `count` (None: no end)."""
        self.count = count
        rate = rate_per_second
        self.rate = None if rate is None else float(rate) * len(splits) / max(total_splits, 1)
        self.stride = total_splits
        self.cursors = {s: int(s.rsplit("-", 1)[1]) for s in splits}
        self.event_times: SplitHighs[str] = SplitHighs()
        self._started = time.monotonic()
        self._emitted = 0

    def record(self, index: int) -> Any:
        """The record at an index."""
        raise NotImplementedError

    def _live(self) -> list[str]:
        return [s for s, i in self.cursors.items() if self.count is None or i < self.count]

    def read(self, max_records: int) -> Batch | None:
        """The next records, split after split in turn; None when all are done."""
        live = self._live()
        self.event_times.start()
        if not live:
            return None
        if self.rate is not None:
            allowed = int((time.monotonic() - self._started) * self.rate) - self._emitted
            if allowed <= 0:
                return Batch([])
            max_records = min(max_records, allowed)
        out: list[Any] = []
        per_split = max(1, max_records // len(live))
        for split in live:
            i = self.cursors[split]
            end = i + per_split * self.stride
            if self.count is not None:
                end = min(end, self.count)
            out.extend(self.record(j) for j in range(i, end, self.stride))
            self.event_times.note(split, len(range(i, end, self.stride)))
            self.cursors[split] = i + len(range(i, end, self.stride)) * self.stride
        self._emitted += len(out)
        return Batch(out)

    def split_highs(self, timestamps: list[int]) -> list[int]:
        """Each record's split high before it (`SplitEventTime`)."""
        return self.event_times.highs_before(timestamps)

    def event_time_floor(self) -> int | None:
        """The lowest high over the splits not done (`SplitEventTime`)."""
        live = self._live()
        return min((self.event_times.highs.get(s, MIN_TIMESTAMP) for s in live), default=None)

    def snapshot(self) -> dict[str, Any]:
        """The next index and the event time of every split."""
        return {"cursors": dict(self.cursors), "eventTimes": dict(self.event_times.highs)}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume every split at its cursor and event time."""
        for split, cursor in state.get("cursors", {}).items():
            if split in self.cursors:
                self.cursors[split] = int(cursor)
        times = state.get("eventTimes", {})
        self.event_times.highs = {s: int(t) for s, t in times.items() if s in self.cursors}

    def close(self) -> None:
        """Nothing to release."""


class GeneratorSource(IndexedSource):
    """Generates the records of the splits assigned to one subtask."""

    def __init__(
        self, config: GeneratorSourceConfig | dict[str, Any], splits: tuple[str, ...], *, total_splits: int
    ) -> None:
        """Prepare the cursors of `splits` (`split-n` names)."""
        c = GeneratorSourceConfig.model_validate(config)
        super().__init__(c.count, splits, total_splits=total_splits, rate_per_second=c.rate_per_second)
        self.kind, self.seed = c.kind, c.seed
        self.vocabulary, self.words_per_line, self.keys = c.vocabulary, c.words_per_line, c.keys

    def record(self, index: int) -> Any:
        """The record at an index."""
        if self.kind == "sequence":
            return index
        if self.kind == "events":
            return {"key": f"k{index % self.keys}", "value": index, "ts": 10 * index}
        base = mix(self.seed ^ (index * 0x100000001B3))
        return " ".join(f"w{mix(base + j) % self.vocabulary}" for j in range(self.words_per_line))


class CollectionSource(IndexedSource):
    """Reads the listed records of the splits assigned to one subtask."""

    def __init__(
        self, config: CollectionSourceConfig | dict[str, Any], splits: tuple[str, ...], *, total_splits: int
    ) -> None:
        """Prepare the cursors of `splits` (`split-n` names)."""
        c = CollectionSourceConfig.model_validate(config)
        super().__init__(len(c.records), splits, total_splits=total_splits)
        self.records = c.records

    def record(self, index: int) -> Any:
        """The listed record at an index."""
        return self.records[index]
