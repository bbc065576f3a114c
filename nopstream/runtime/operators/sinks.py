"""The sink operator: the end of a chain, handing batches to a connector's writer."""

from __future__ import annotations

from typing import Any

from nopstream.records import Batch, SinkRecovery, SinkStart, SinkWriter
from nopstream.runtime.operators.base import STATE_SCHEMA_VERSION, empty_like


class SinkOperator:
    """Writes every batch it gets; outputs nothing."""

    watermark_delay = 0

    def __init__(self, writer: SinkWriter) -> None:
        """Wrap a connector's writer."""
        self.writer = writer

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Write the batch."""
        if batch.records:
            self.writer.write(batch)
        return empty_like(batch)

    def on_watermark(self, watermark: int) -> Batch | None:
        """Sinks do not wait for event time."""
        return None

    def on_processing_time(self, now: int) -> Batch | None:
        """Sinks do not wait for processing time."""
        return None

    def on_end(self) -> Batch | None:
        """Release the writer; what it holds waits for its epoch's commit."""
        self.writer.finish()
        return None

    def timers(self) -> int:
        """Sinks set no timers."""
        return 0

    def prepare(self, epoch: int) -> None:
        """Barrier `epoch`: pre-commit the open transaction."""
        self.writer.prepare(epoch)

    def commit(self, upto: int) -> None:
        """Publish pending transactions up to `upto`."""
        self.writer.commit(upto)

    def publish_held(self) -> None:
        """A job without checkpoints: what the writer holds is staged and published as epoch 1."""
        self.writer.prepare(1)
        self.writer.commit(1)

    def recover(self, start: SinkStart) -> SinkRecovery:
        """Start of a run: re-commit up to the durable epoch, abort the rest."""
        return self.writer.recover(start)

    def snapshot(self) -> dict[str, Any]:
        """The writer's state."""
        return {"schemaVersion": STATE_SCHEMA_VERSION, "sink": self.writer.snapshot()}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume the writer."""
        self.writer.restore(state.get("sink", {}))
