"""The catalogue of connector types: their config schema and declared capability.

The model layer holds the catalogue so that validation can check a job without
importing any connector code; `nopstream.connectors` implements each entry and a
test keeps the two in agreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt
from pydantic.alias_generators import to_camel

from nopstream.model.capabilities import SinkCapability, SourceCapability


class ConnectorConfig(BaseModel):
    """Base of every connector config: camelCase keys, unknown keys refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class FileSourceConfig(ConnectorConfig):
    """Files matching a glob; one split per file, read as text lines or JSON lines."""

    path: str
    format: Literal["text", "jsonl"] = "text"
    discovery_interval_ms: StrictInt | None = None


class GeneratorSourceConfig(ConnectorConfig):
    """A deterministic generator: the same config always yields the same records."""

    kind: Literal["sequence", "words", "events"] = "sequence"
    count: StrictInt | None = None
    splits: StrictInt | None = None
    seed: StrictInt = 0
    rate_per_second: StrictFloat | None = None
    vocabulary: StrictInt = 10_000
    words_per_line: StrictInt = 10
    keys: StrictInt = 100


class S3SourceConfig(ConnectorConfig):
    """Objects under a bucket prefix, read as text lines or JSON lines."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    secret_ref: str | None = None
    format: Literal["text", "jsonl"] = "text"


class FileSinkConfig(ConnectorConfig):
    """A directory that receives one committed file per sink subtask and epoch."""

    path: str
    format: Literal["jsonl", "text"] = "jsonl"


class S3SinkConfig(ConnectorConfig):
    """A bucket prefix that receives objects published on commit."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    secret_ref: str | None = None
    format: Literal["jsonl", "text"] = "jsonl"


class StdoutSinkConfig(ConnectorConfig):
    """Standard output of the task process."""

    format: Literal["jsonl", "text"] = "jsonl"


@dataclass(frozen=True)
class SourceType:
    """A source type: its config schema and what it promises on replay."""

    name: str
    capability: SourceCapability
    config: type[ConnectorConfig]


@dataclass(frozen=True)
class SinkType:
    """A sink type: its config schema and how it commits."""

    name: str
    capability: SinkCapability
    config: type[ConnectorConfig]


SOURCE_TYPES: dict[str, SourceType] = {
    s.name: s
    for s in (
        SourceType("file", SourceCapability.REPLAYABLE, FileSourceConfig),
        SourceType("generator", SourceCapability.REPLAYABLE, GeneratorSourceConfig),
        SourceType("s3", SourceCapability.REPLAYABLE, S3SourceConfig),
    )
}

SINK_TYPES: dict[str, SinkType] = {
    s.name: s
    for s in (
        SinkType("file", SinkCapability.STAGED_ATOMIC_COMMIT, FileSinkConfig),
        SinkType("s3", SinkCapability.STAGED_ATOMIC_COMMIT, S3SinkConfig),
        SinkType("stdout", SinkCapability.AT_LEAST_ONCE, StdoutSinkConfig),
    )
}
