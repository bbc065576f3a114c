"""The `stdout` sink (AT_LEAST_ONCE): records printed as they arrive, one per line.

It cannot take back what it printed, so after a recovery records since the last
durable epoch are printed again; the compiler refuses it under STRICT_EXACTLY_ONCE.
"""

from __future__ import annotations

import sys
from typing import Any

from nopstream.connectors.lines import LineFormat
from nopstream.model.connectors import StdoutSinkConfig
from nopstream.records import Batch, SinkRecovery, SinkStart


class StdoutSink:
    """Prints records to the task's standard output."""

    def __init__(self, config: StdoutSinkConfig | dict[str, Any]) -> None:
        """Print as JSON lines or as text."""
        self.lines = LineFormat(StdoutSinkConfig.model_validate(config).format)

    def write(self, batch: Batch) -> None:
        """Print the batch."""
        sys.stdout.buffer.write(self.lines.encode(batch.records))

    def prepare(self, epoch: int) -> None:
        """Nothing to stage: records are already printed."""

    def commit(self, upto: int) -> None:
        """Nothing to publish."""

    def recover(self, start: SinkStart) -> SinkRecovery:
        """Nothing to re-commit or abort."""
        return SinkRecovery()

    def snapshot(self) -> dict[str, Any]:
        """No state."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """No state."""

    def finish(self) -> None:
        """Flush standard output."""
        sys.stdout.flush()
