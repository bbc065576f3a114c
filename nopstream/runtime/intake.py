"""What a source task does to each batch its reader gave before the chain sees it.

With event time, every record gets its timestamp (its field, its function, or its
reader's) and its mark (`WatermarkGenerator.observe`: its split's watermark when it was
read). A record the source cannot take (an `Unreadable` line, a timestamp that fails)
fails the task naming the source, or, with `onError: dead-letter`, leaves the batch for
the source's dead-letter output after its split's event time has seen it (so the marks
of the records around it are the same as if it had been good).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nopstream.errors import OperatorFailed, error_text, user_frame
from nopstream.plan.streamgraph import StreamNode
from nopstream.records import MIN_TIMESTAMP, Batch, SplitEventTime, Unreadable
from nopstream.runtime.operators.base import DeadLetters, dead_letter
from nopstream.runtime.watermarks import WatermarkGenerator


class Intake:
    """Timestamps, marks and dead letters of one source subtask's batches."""

    def __init__(
        self,
        node: StreamNode,
        timestamps: Callable[[Any], int] | None,
        generator: WatermarkGenerator | None,
        splits: SplitEventTime | None,
        side: Callable[[str, Batch], None],
    ) -> None:
        """`timestamps` reads a record's (None: the reader gives them); `splits`, the reader's split
        highs when it has splits; dead letters go to `side(tag, batch)`."""
        self.what = f"source '{node.node_id}' ({node.type})"
        self.ts_fn, self.generator, self.splits = timestamps, generator, splits
        self.dead = DeadLetters(node, side)
        self.set_aside = 0  # records sent to the dead-letter output so far

    def take(self, batch: Batch) -> Batch:
        """`batch` stamped and marked (with event time), without the records set aside."""
        bad: dict[int, Unreadable | Exception] = {}
        if self.dead.on:
            bad = {i: r for i, r in enumerate(batch.records) if type(r) is Unreadable}
        gen = self.generator
        if gen is not None:
            if self.ts_fn is not None:
                batch.timestamps = self._timestamps(batch.records, bad)
            stamps = batch.timestamps
            assert stamps is not None, "validation: a reader without timestamps needs a field or fn"
            highs = self.splits.split_highs(stamps) if self.splits is not None else None
            batch.marks = gen.observe(stamps, highs)
        if not bad:
            return batch
        marks, source = batch.marks, self.dead.node_id
        for i, why in bad.items():
            if isinstance(why, Unreadable):
                letter = dead_letter(source, why.reason, None, why.text)
            else:
                letter = dead_letter(source, error_text(why), user_frame(why), batch.records[i])
            # a dead letter of a source has no event time of its own: the earliest, with its record's mark
            self.dead.letter(
                letter, None if marks is None else MIN_TIMESTAMP, None if marks is None else marks[i]
            )
        self.set_aside += len(bad)
        return batch.pick([i for i in range(len(batch.records)) if i not in bad])

    def _timestamps(self, records: list[Any], bad: dict[int, Unreadable | Exception]) -> list[int]:
        """Each record's timestamp; one that fails (or an unreadable record) stands at the earliest time,
        its error in `bad`, when the source dead-letters."""
        ts_fn = self.ts_fn
        assert ts_fn is not None
        if not bad:
            try:
                return [ts_fn(r) for r in records]
            except Exception as exc:
                if not self.dead.on:
                    raise OperatorFailed.of(self.what, exc) from exc
        stamps = []
        for i, record in enumerate(records):
            if i not in bad:
                try:
                    stamps.append(ts_fn(record))
                    continue
                except Exception as exc:
                    bad[i] = exc
            stamps.append(MIN_TIMESTAMP)
        return stamps
