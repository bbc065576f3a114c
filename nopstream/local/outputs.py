"""What a sink committed, read back: `nopstream chaos` compares it, a `Job.run()` result returns it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nopstream.connectors import files, kafka, postgres
from nopstream.connectors import s3 as s3_connector

_COMMITTED: dict[str, Callable[[dict[str, Any]], list[Any]]] = {
    "file": files.committed_records,
    "s3": s3_connector.committed_records,
    "postgres": postgres.table_records,
    "kafka": kafka.topic_records,
}
"""What each sink type that commits can read back of its committed output."""


def committed_records(sink_type: str, config: dict[str, Any]) -> list[Any] | None:
    """Every record a sink of this type and config committed, or None for a type that commits nothing
    (`stdout`)."""
    read = _COMMITTED.get(sink_type)
    return None if read is None else read(config)
