"""The catalogue of connector types: their config schema and declared capability.

The model layer holds the catalogue so that validation can check a job without
importing any connector code; `nopstream.connectors` implements each entry and a
test keeps the two in agreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nopstream.model.capabilities import SinkCapability, SourceCapability
from nopstream.model.connector_config import ConnectorConfig
from nopstream.model.connectors import (
    CollectionSourceConfig,
    FileSinkConfig,
    FileSourceConfig,
    GeneratorSourceConfig,
    KafkaSinkConfig,
    KafkaSourceConfig,
    PostgresCdcSourceConfig,
    PostgresSinkConfig,
    S3SinkConfig,
    S3SourceConfig,
    StdoutSinkConfig,
)


@dataclass(frozen=True)
class SourceType:
    """A source type: its config schema and what it promises on replay."""

    name: str
    capability: SourceCapability
    config: type[ConnectorConfig]
    timestamps: bool = False
    """Whether its records carry event timestamps of their own (a watermark then needs no field or fn)."""
    local_files: str | None = None
    """The config key of a glob of files on the machine that runs it (checked for something to read)."""


@dataclass(frozen=True)
class SinkType:
    """A sink type: its config schema and how it commits."""

    name: str
    capability: SinkCapability
    config: type[ConnectorConfig]
    local_directory: str | None = None
    """The config key of a directory on the machine that runs it (checked as a place one may write)."""


SOURCE_TYPES: dict[str, SourceType] = {
    s.name: s
    for s in (
        SourceType("file", SourceCapability.REPLAYABLE, FileSourceConfig, local_files="path"),
        SourceType("generator", SourceCapability.REPLAYABLE, GeneratorSourceConfig),
        SourceType("collection", SourceCapability.REPLAYABLE, CollectionSourceConfig),
        SourceType("s3", SourceCapability.REPLAYABLE, S3SourceConfig),
        SourceType("kafka", SourceCapability.REPLAYABLE, KafkaSourceConfig, timestamps=True),
        SourceType("postgres-cdc", SourceCapability.REPLAYABLE, PostgresCdcSourceConfig, timestamps=True),
    )
}

SINK_TYPES: dict[str, SinkType] = {
    s.name: s
    for s in (
        SinkType("file", SinkCapability.STAGED_ATOMIC_COMMIT, FileSinkConfig, local_directory="path"),
        SinkType("s3", SinkCapability.STAGED_ATOMIC_COMMIT, S3SinkConfig),
        SinkType("postgres", SinkCapability.TWO_PHASE_COMMIT, PostgresSinkConfig),
        SinkType("kafka", SinkCapability.OUTBOX_EPOCH_LOG, KafkaSinkConfig),
        SinkType("stdout", SinkCapability.AT_LEAST_ONCE, StdoutSinkConfig),
    )
}


def local_directory(sink_type: str, config: dict[str, Any]) -> tuple[str, str] | None:
    """The config key and the directory on the running machine that a sink of `sink_type` writes, or None."""
    kind = SINK_TYPES.get(sink_type)
    return _named(config, kind.local_directory if kind is not None else None)


def local_files(source_type: str, config: dict[str, Any]) -> tuple[str, str] | None:
    """The config key and the glob of files on the running machine that such a source reads, or None."""
    kind = SOURCE_TYPES.get(source_type)
    return _named(config, kind.local_files if kind is not None else None)


def _named(config: dict[str, Any], key: str | None) -> tuple[str, str] | None:
    value = config.get(key) if key is not None else None
    return (key, value) if key is not None and isinstance(value, str) else None
