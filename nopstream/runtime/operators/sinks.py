"""The sink operator: the end of a chain, handing batches to a connector's writer."""

from __future__ import annotations

from typing import Any

from nopstream.runtime.connectors import SinkWriter
from nopstream.runtime.frames import Batch
from nopstream.runtime.operators.base import STATE_SCHEMA_VERSION, empty_like


class SinkOperator:
    """Writes every batch it gets; outputs nothing."""

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
        """Make everything written visible."""
        self.writer.finish()
        return None

    def snapshot(self) -> dict[str, Any]:
        """The writer's state."""
        return {"schemaVersion": STATE_SCHEMA_VERSION, "sink": self.writer.snapshot()}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume the writer."""
        self.writer.restore(state.get("sink", {}))
