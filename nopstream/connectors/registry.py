"""The connector factory: builds each source and sink type of the model's catalogue.

The S3, Kafka and PostgreSQL connectors are imported when a job uses them: their
client libraries take a third of a task process's start (measured), and every task of
a recovery starts at once on the same cores. A process that forks the tasks imports
them once before (`preload`), and every child has them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from nopstream.connectors.files import FileSink, FileSource
from nopstream.connectors.generator import CollectionSource, GeneratorSource
from nopstream.connectors.staged import SinkName
from nopstream.connectors.stdout import StdoutSink
from nopstream.model.connectors import SINK_TYPES, SOURCE_TYPES
from nopstream.plan.partitioned import SourceSplits
from nopstream.plan.streamgraph import JobIdentity, StreamNode
from nopstream.records import LookupClient, SinkWriter, SourceReader

_IMPORTED_WHEN_USED = {
    "s3": "nopstream.connectors.s3",
    "kafka": "nopstream.connectors.kafka",
    "postgres": "nopstream.connectors.postgres",
}


def preload(nodes: Iterable[StreamNode]) -> None:
    """Import now the connector modules that the sources and sinks among `nodes` import when used."""
    for node in nodes:
        module = _IMPORTED_WHEN_USED.get(node.type) if node.kind in ("source", "sink") else None
        if module is not None:
            importlib.import_module(module)


class Connectors:
    """Builds readers and writers for the connector types this build implements."""

    def __init__(self, identity: JobIdentity) -> None:
        """Connectors of one job (its identity names sink transactions)."""
        self.identity = identity

    def source(
        self, node: StreamNode, splits: SourceSplits, *, subtask: int, parallelism: int
    ) -> SourceReader:
        """The reader of one source subtask."""
        config = node.spec.get("config", {})
        keep = node.spec.get("onError") == "dead-letter"  # unreadable records are set aside, not refused
        if node.type == "file":
            return FileSource(config, subtask=subtask, parallelism=parallelism, keep_unreadable=keep)
        if node.type == "s3":  # imported when used, as each client library is: it costs every start
            from nopstream.connectors.s3 import S3Source

            return S3Source(config, subtask=subtask, parallelism=parallelism, keep_unreadable=keep)
        if node.type == "kafka":
            from nopstream.connectors.kafka import KafkaSource

            idle = (node.spec.get("watermark") or {}).get("idleTimeoutMs")
            return KafkaSource(
                config, subtask=subtask, parallelism=parallelism, idle_timeout_ms=idle, keep_unreadable=keep
            )
        if node.type in ("generator", "collection"):
            assignment = splits.assignment or ()
            total = sum(len(a) for a in assignment)
            indexed = GeneratorSource if node.type == "generator" else CollectionSource
            return indexed(config, assignment[subtask], total_splits=total)
        raise NotImplementedError(
            f"source type '{node.type}' ({SOURCE_TYPES[node.type].capability}) is not"
            " implemented by this build"
        )

    def _name(self, node: StreamNode, subtask: int) -> SinkName:
        """A sink subtask's name: its transaction ids and the names of its objects (never random)."""
        return SinkName(self.identity.job_id, self.identity.pipeline_id, node.node_id, subtask)

    def sink(self, node: StreamNode, *, subtask: int, parallelism: int) -> SinkWriter:
        """The writer of one sink subtask."""
        config = node.spec.get("config", {})
        if node.type == "file":
            return FileSink(config, name=self._name(node, subtask))
        if node.type == "s3":
            from nopstream.connectors.s3 import S3Sink

            return S3Sink(config, name=self._name(node, subtask))
        if node.type == "stdout":
            return StdoutSink(config)
        if node.type == "kafka":
            from nopstream.connectors.kafka import KafkaSink

            return KafkaSink(config, name=self._name(node, subtask))
        if node.type == "postgres":
            from nopstream.connectors.postgres import PostgresSink

            return PostgresSink(config, name=self._name(node, subtask))
        raise NotImplementedError(
            f"sink type '{node.type}' ({SINK_TYPES[node.type].capability}) is not implemented by this build"
        )

    def lookup(self, node: StreamNode, *, capacity: int) -> LookupClient:
        """The client of a lookup operator's subtask (`lookup.kind`), for up to `capacity` calls at once."""
        spec = node.spec["lookup"]
        if spec["kind"] == "http":
            from nopstream.connectors.http import HttpLookup

            return HttpLookup(spec)
        from nopstream.connectors.postgres import PostgresLookup

        return PostgresLookup(spec, capacity)
