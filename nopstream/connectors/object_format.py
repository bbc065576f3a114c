"""How the file and s3 connectors read and write objects, whatever the format: lines or Parquet.

A source of lines reads stripes of its objects (`connectors.striped`), one of Parquet
row groups (`connectors.parquet`). A sink opens a writer per transaction and appends
what each `add` returns to the object it stages, then what `end` returns; reading a
committed object back (`nopstream chaos`) is `records`. Parquet's module (pyarrow) is imported only by a job
that uses it: it takes longer to import than the rest of a task together.
"""

from __future__ import annotations

from typing import Any, Protocol

from nopstream.connectors.lines import LineFormat
from nopstream.connectors.striped import Objects, StripedSource
from nopstream.model.formats import ObjectSinkFormatConfig, ObjectSourceFormatConfig
from nopstream.records import SourceReader


class ObjectWriter(Protocol):
    """One object as it is written."""

    def add(self, records: list[Any]) -> bytes:
        """The bytes that follow what was written, holding `records` (a format may hold some back
        until `end`); BadRecord, with nothing written, for a record the format cannot write."""
        ...

    def end(self) -> bytes:
        """The bytes that end the object."""
        ...


class ObjectFormat(Protocol):
    """A format of whole objects."""

    ext: str
    """The extension of the objects' names."""

    def writer(self) -> ObjectWriter:
        """The writer of a new object."""
        ...

    def records(self, data: bytes) -> list[Any]:
        """The records of a whole object written in this format."""
        ...


def sink_format(config: ObjectSinkFormatConfig) -> ObjectFormat:
    """The format a sink's config names."""
    if config.format == "parquet":
        from nopstream.connectors.parquet import ParquetFormat

        assert config.parquet is not None  # the config requires it
        return ParquetFormat(config.parquet)
    return LineFormat.of(config)


def object_source(
    objects: Objects,
    config: ObjectSourceFormatConfig,
    *,
    subtask: int,
    parallelism: int,
    discovery_ms: int | None = None,
    keep_unreadable: bool = False,
) -> SourceReader:
    """The reader of one source subtask's share of `objects`, in the format `config` names."""
    if config.format == "parquet":
        from nopstream.connectors.parquet import ParquetSource

        return ParquetSource(
            objects,
            columns=config.parquet.columns if config.parquet is not None else None,
            subtask=subtask,
            parallelism=parallelism,
            discovery_ms=discovery_ms,
            keep_unreadable=keep_unreadable,
        )
    return StripedSource(
        objects,
        lines=LineFormat.of(config),
        subtask=subtask,
        parallelism=parallelism,
        discovery_ms=discovery_ms,
        keep_unreadable=keep_unreadable,
    )
