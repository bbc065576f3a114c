"""The event time of each split a reader reads: the highest timestamp read in it so far.

A reader notes which split each record of a batch came from (`note`, runs of equal
splits in order); the task then hands it the batch's timestamps (`SplitEventTime.split_highs`)
and gets back, for each record, its split's high before it: its watermark is that
minus the allowed out-of-orderness, so what is late depends on the split's own data.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import accumulate
from typing import Generic, TypeVar

from nopstream.records import MIN_TIMESTAMP

S = TypeVar("S", bound=Hashable)


class SplitHighs(Generic[S]):
    """The highest timestamp read per split, and the splits of the last batch read."""

    def __init__(self) -> None:
        """No split read yet."""
        self.highs: dict[S, int] = {}
        self._splits: list[S] = []  # runs of records of one split, in batch order
        self._counts: list[int] = []

    def start(self) -> None:
        """A new batch is being read (the runs of one that nobody asked the highs of are forgotten)."""
        self._splits, self._counts = [], []

    def note(self, split: S, count: int = 1) -> None:
        """The next `count` records of the batch being read come from `split`."""
        if self._splits and self._splits[-1] == split:
            self._counts[-1] += count
        elif count:
            self._splits.append(split)
            self._counts.append(count)

    def highs_before(self, timestamps: list[int]) -> list[int]:
        """Each record's split high before it, for the batch noted (then forgotten); the highs advance."""
        out: list[int] = []
        at = 0
        highs = self.highs
        for split, count in zip(self._splits, self._counts, strict=True):
            stamps = timestamps[at : at + count]
            at += count
            running = list(accumulate(stamps, max, initial=highs.get(split, MIN_TIMESTAMP)))
            out.extend(running[:-1])
            highs[split] = running[-1]
        self.start()
        if at != len(timestamps):
            raise RuntimeError(f"a batch of {len(timestamps)} timestamps for {at} records noted")
        return out
