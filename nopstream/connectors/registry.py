"""The connector types this build implements: one descriptor each, and the factory over them.

A descriptor holds everything the rest of the program does with a type, so that nothing
else branches on a type's name: its reader or writer, and for a sink its place with a
relative path anchored, a copy of its config that writes somewhere of its own (each run
of `nopstream chaos`), how to make that place like the sink's and drop it after, and how
to read back what it committed. The S3, Kafka and PostgreSQL modules are imported when a
job uses them: their client libraries take a third of a task process's start (measured),
and every task of a recovery starts at once on the same cores. A process that forks the
tasks imports them once before (`preload`), and every child has them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nopstream.connectors.files import FileSink, committed_records, file_source
from nopstream.connectors.generator import CollectionSource, GeneratorSource
from nopstream.connectors.staged import SinkName
from nopstream.connectors.stdout import StdoutSink
from nopstream.model.catalogue import SINK_TYPES, SOURCE_TYPES
from nopstream.plan.partitioned import SourceSplits
from nopstream.plan.streamgraph import JobIdentity, StreamNode
from nopstream.records import LookupClient, SinkWriter, SourceReader

Config = dict[str, Any]


@dataclass(frozen=True)
class SourceArgs:
    """What a source subtask's reader is made from."""

    node: StreamNode
    splits: SourceSplits
    subtask: int
    parallelism: int

    @property
    def config(self) -> Config:
        """The source's connector config."""
        config: Config = self.node.spec.get("config", {})
        return config

    @property
    def keep_unreadable(self) -> bool:
        """Whether unreadable records are set aside (`onError: dead-letter`), not refused."""
        return bool(self.node.spec.get("onError") == "dead-letter")


def _not_isolated(config: Config, _: str) -> Config:
    """A source whose reading changes nothing at its origin: every run reads it as it is."""
    return config


@dataclass(frozen=True)
class SourceKind:
    """A source type: its reader, the module it lives in when imported only when used, and, for a
    source whose origin remembers what it has read (a replication slot), a run's own copy of it."""

    read: Callable[[SourceArgs], SourceReader]
    module: str | None = None
    isolated: Callable[[Config, str], Config] = _not_isolated
    """The config of a run's own reading position, named with the tag given."""
    create_like: Callable[[Config, Config], None] | None = None
    """Make the run's own position (the second config) where the source's own is (the first)."""
    drop: Callable[[Config], None] | None = None
    """Remove the run's own position once its output is compared."""


def _same(config: Config) -> Config:
    return config


def _shared(config: Config, _: Path, __: str) -> Config:
    """No output of its own to isolate (stdout)."""
    return config


@dataclass(frozen=True)
class SinkKind:
    """A sink type: its writer and what is done with its output outside a run."""

    write: Callable[[Config, SinkName], SinkWriter]
    module: str | None = None
    committed: Callable[[Config], list[Any]] | None = None
    """Every record committed to the sink's output (None: it commits nothing to read back)."""
    anchored: Callable[[Config], Config] = _same
    """The config with a relative place made absolute where the run resolves it (the working directory)."""
    isolated: Callable[[Config, Path, str], Config] = _shared
    """The config of a run's own output: under the directory given, or named with the tag given."""
    create_like: Callable[[Config, Config], None] | None = None
    """Make an isolated output (the second config) empty, like the sink's own (the first)."""
    drop: Callable[[Config], None] | None = None
    """Remove an isolated output once it is compared."""


def _file_source(a: SourceArgs) -> SourceReader:
    return file_source(
        a.config, subtask=a.subtask, parallelism=a.parallelism, keep_unreadable=a.keep_unreadable
    )


def _s3_source(a: SourceArgs) -> SourceReader:
    from nopstream.connectors.s3 import s3_source

    keep = a.keep_unreadable
    return s3_source(a.config, subtask=a.subtask, parallelism=a.parallelism, keep_unreadable=keep)


def _kafka_source(a: SourceArgs) -> SourceReader:
    from nopstream.connectors.kafka import KafkaSource

    idle = (a.node.spec.get("watermark") or {}).get("idleTimeoutMs")
    return KafkaSource(
        a.config,
        subtask=a.subtask,
        parallelism=a.parallelism,
        idle_timeout_ms=idle,
        keep_unreadable=a.keep_unreadable,
    )


def _postgres_cdc_source(a: SourceArgs) -> SourceReader:
    from nopstream.connectors.postgres_cdc import PostgresCdcSource

    return PostgresCdcSource(a.config, subtask=a.subtask)


def _indexed(kind: type[GeneratorSource] | type[CollectionSource]) -> Callable[[SourceArgs], SourceReader]:
    def read(a: SourceArgs) -> SourceReader:
        assignment = a.splits.assignment or ()
        return kind(a.config, assignment[a.subtask], total_splits=sum(len(s) for s in assignment))

    return read


def _tagged(name: str, tag: str) -> str:
    """`name` with a run's tag after it, still a PostgreSQL identifier of at most 63 bytes."""
    return f"{name[: 62 - len(tag)]}_{tag.replace('-', '_')}"


def _postgres_cdc_isolated(config: Config, tag: str) -> Config:
    """The run's own slot, named after the source's."""
    return {**config, "slot": _tagged(config["slot"], tag)}


def _postgres_cdc_copy(original: Config, isolated: Config) -> None:
    from nopstream.connectors.postgres_cdc import copy_slot

    copy_slot(original, isolated["slot"])


def _postgres_cdc_drop(config: Config) -> None:
    from nopstream.connectors.postgres_cdc import drop_slot

    drop_slot(config)


SOURCES: dict[str, SourceKind] = {
    "file": SourceKind(_file_source),
    "s3": SourceKind(_s3_source, "nopstream.connectors.s3"),
    "kafka": SourceKind(_kafka_source, "nopstream.connectors.kafka"),
    "postgres-cdc": SourceKind(
        _postgres_cdc_source,
        "nopstream.connectors.postgres_cdc",
        isolated=_postgres_cdc_isolated,
        create_like=_postgres_cdc_copy,
        drop=_postgres_cdc_drop,
    ),
    "generator": SourceKind(_indexed(GeneratorSource)),
    "collection": SourceKind(_indexed(CollectionSource)),
}


def _file_anchored(config: Config) -> Config:
    path = config.get("path")
    return {**config, "path": str(Path(path).resolve())} if isinstance(path, str) else config


def _s3_sink(config: Config, name: SinkName) -> SinkWriter:
    from nopstream.connectors.s3 import S3Sink

    return S3Sink(config, name=name)


def _s3_committed(config: Config) -> list[Any]:
    from nopstream.connectors.s3 import committed_records as s3_committed

    return s3_committed(config)


def _kafka_sink(config: Config, name: SinkName) -> SinkWriter:
    from nopstream.connectors.kafka import KafkaSink

    return KafkaSink(config, name=name)


def _kafka_committed(config: Config) -> list[Any]:
    from nopstream.connectors.kafka import topic_records

    return topic_records(config)


def _kafka_create_like(original: Config, isolated: Config) -> None:
    from nopstream.connectors.kafka import create_like

    create_like(original, isolated["topic"])


def _kafka_drop(config: Config) -> None:
    from nopstream.connectors.kafka import delete_topic

    delete_topic(config)


def _postgres_sink(config: Config, name: SinkName) -> SinkWriter:
    from nopstream.connectors.postgres import PostgresSink

    return PostgresSink(config, name=name)


def _postgres_committed(config: Config) -> list[Any]:
    from nopstream.connectors.postgres import table_records

    return table_records(config)


def _postgres_create_like(original: Config, isolated: Config) -> None:
    from nopstream.connectors.postgres import create_like

    create_like(original, isolated["table"])


def _postgres_drop(config: Config) -> None:
    from nopstream.connectors.postgres import drop_table

    drop_table(config)


def _postgres_isolated(config: Config, _: Path, tag: str) -> Config:
    """The run's own table beside the sink's (schema dropped: it is created in the search path)."""
    return {**config, "table": _tagged(config["table"].rsplit(".", 1)[-1], tag)}


SINKS: dict[str, SinkKind] = {
    "file": SinkKind(
        lambda config, name: FileSink(config, name=name),
        committed=committed_records,
        anchored=_file_anchored,
        isolated=lambda config, home, _: {**config, "path": str(home.resolve())},
    ),
    "s3": SinkKind(
        _s3_sink,
        "nopstream.connectors.s3",
        committed=_s3_committed,
        isolated=lambda config, _, tag: {**config, "prefix": f"{config.get('prefix', '')}{tag}/"},
    ),
    "stdout": SinkKind(lambda config, _: StdoutSink(config)),
    "kafka": SinkKind(
        _kafka_sink,
        "nopstream.connectors.kafka",
        committed=_kafka_committed,
        isolated=lambda config, _, tag: {**config, "topic": f"{config['topic'][: 248 - len(tag)]}.{tag}"},
        create_like=_kafka_create_like,
        drop=_kafka_drop,
    ),
    "postgres": SinkKind(
        _postgres_sink,
        "nopstream.connectors.postgres",
        committed=_postgres_committed,
        isolated=_postgres_isolated,
        create_like=_postgres_create_like,
        drop=_postgres_drop,
    ),
}


def _http_lookup(spec: Config, _: int) -> LookupClient:
    from nopstream.connectors.http import HttpLookup

    return HttpLookup(spec)


def _postgres_lookup(spec: Config, capacity: int) -> LookupClient:
    from nopstream.connectors.postgres import PostgresLookup

    return PostgresLookup(spec, capacity)


LOOKUPS: dict[str, Callable[[Config, int], LookupClient]] = {
    "http": _http_lookup,
    "postgres": _postgres_lookup,
}
"""The client of each lookup kind, from its spec and the calls it may make at once."""


def source_kind(source_type: str) -> SourceKind:
    """The descriptor of a source type of the catalogue; NotImplementedError for one this build lacks."""
    if source_type not in SOURCES:
        raise NotImplementedError(f"source type '{source_type}' is not implemented by this build")
    return SOURCES[source_type]


def sink_kind(sink_type: str) -> SinkKind:
    """The descriptor of a sink type of the catalogue; NotImplementedError for one this build lacks."""
    if sink_type not in SINKS:
        raise NotImplementedError(
            f"sink type '{sink_type}' ({SINK_TYPES[sink_type].capability}) is not implemented by this build"
        )
    return SINKS[sink_type]


def preload(nodes: Iterable[StreamNode]) -> None:
    """Import now the connector modules that the sources and sinks among `nodes` import when used."""
    for node in nodes:
        kinds: dict[str, SourceKind] | dict[str, SinkKind] = SOURCES if node.kind == "source" else SINKS
        kind = kinds.get(node.type) if node.kind in ("source", "sink") else None
        if kind is not None and kind.module is not None:
            importlib.import_module(kind.module)
        if kind is not None and node.spec.get("config", {}).get("format") == "parquet":
            importlib.import_module("nopstream.connectors.parquet")  # pyarrow: the slowest import of all


class Connectors:
    """Builds readers, writers and lookup clients for the connector types this build implements."""

    def __init__(self, identity: JobIdentity) -> None:
        """Connectors of one job (its identity names sink transactions)."""
        self.identity = identity

    def source(
        self, node: StreamNode, splits: SourceSplits, *, subtask: int, parallelism: int
    ) -> SourceReader:
        """The reader of one source subtask."""
        kind = SOURCES.get(node.type)
        if kind is None:
            raise NotImplementedError(
                f"source type '{node.type}' ({SOURCE_TYPES[node.type].capability}) is not"
                " implemented by this build"
            )
        return kind.read(SourceArgs(node, splits, subtask, parallelism))

    def sink(self, node: StreamNode, *, subtask: int, parallelism: int) -> SinkWriter:
        """The writer of one sink subtask, its transactions named after it (never random)."""
        name = SinkName(self.identity.job_id, self.identity.pipeline_id, node.node_id, subtask)
        return sink_kind(node.type).write(node.spec.get("config", {}), name)

    def lookup(self, node: StreamNode, *, capacity: int) -> LookupClient:
        """The client of a lookup operator's subtask (`lookup.kind`), for up to `capacity` calls at once."""
        spec = node.spec["lookup"]
        return LOOKUPS[spec["kind"]](spec, capacity)
