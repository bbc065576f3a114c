"""The `kafka` source (REPLAYABLE) and sink (OUTBOX_EPOCH_LOG), with confluent-kafka (librdkafka).

Source: one split per partition of a topic (or of every topic a pattern matches);
partition `p` of topic `t` belongs to subtask `(stableHash(t) + p) mod parallelism`.
The reader assigns its partitions itself (no consumer group, nothing committed to
Kafka) and reads `read_committed`. Cursor: the next offset of each partition (an
exclusive cut), checkpointed with the partitions it knows (the enumerator state) and,
when `bounded`, the end offsets taken at the job's first start, so a restart stops at
the same place. A fresh job starts at `startingOffsets` (resolved to numbers at once
and checkpointed); partitions found later by discovery start at their beginning.
Records carry their Kafka timestamps (`Batch.timestamps`) for event time. Each
partition is a split with its own event time (`SplitEventTime`): a record is judged
late against its own partition's watermark, and the subtask's watermark follows the
slowest partition still read (`event_time_floor`), so a partition read behind another
never sees its records come late; one with no record for the watermark's idle timeout
stops holding it back.

Sink: no Python client can commit a transaction prepared by a process that died
(KIP-939 is not in librdkafka), so the sink publishes only durable epochs. At barrier
N the epoch's records become part of the sink's snapshot (durable with epoch N in
checkpoint storage); once N is durable they are produced in one Kafka transaction of
the subtask's fixed `transactional.id` together with a marker of N: the offset N
committed, in the same transaction, for the sink's own consumer group on partition 0
of the topic (metadata `lineage=L`). A `read_committed` consumer sees each epoch
whole, once. After a restart `init_transactions` fences the dead producer and aborts
its open transaction; the marker says which epochs are published, the rest are
published again. A transaction lasts only one publish, so `transaction.timeout.ms`
need not cover a checkpoint interval.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin._metadata import ClusterMetadata

from nopstream.connectors.event_time import SplitHighs
from nopstream.connectors.kafka_clients import TIMEOUT, admin, client_config, consumer, reach
from nopstream.connectors.payloads import PayloadError, PlainCodec, RegistryCodec, ValueCodec, value_codec
from nopstream.connectors.staged import OutputConflict, SinkName, StagedSink
from nopstream.errors import BadInput, StartRefused, shown_record
from nopstream.model.connectors import KafkaSinkConfig, KafkaSourceConfig
from nopstream.plan.keys import stable_hash
from nopstream.records import MIN_TIMESTAMP, Batch, SinkRecovery, SinkStart, Unreadable

Split = tuple[str, int]
"""A partition of a topic."""


def _key(split: Split) -> str:
    return f"{split[0]}:{split[1]}"


def _split(key: str) -> Split:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


class KafkaSource:
    """Reads the partitions of one source subtask."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        subtask: int,
        parallelism: int,
        idle_timeout_ms: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        keep_unreadable: bool = False,
    ) -> None:
        """Find this subtask's partitions and where a fresh job starts on them; a partition with no
        record for `idle_timeout_ms` (the watermark's) by `clock` no longer holds event time back.
        With `keep_unreadable` a value that does not decode is an `Unreadable`, not a failure."""
        self.config = KafkaSourceConfig.model_validate(config)
        self.keep_unreadable = keep_unreadable
        self.idle_timeout_ms = idle_timeout_ms
        self._clock = clock
        self.subtask = subtask
        self.parallelism = parallelism
        self._pattern = re.compile(self.config.topic_pattern) if self.config.topic_pattern else None
        cluster = reach(self.config, self.config.topic)  # first: it refuses what no retry mends
        who = f"kafka source '{self.config.topic or self.config.topic_pattern}'"
        self.codec = value_codec(self.config, who, self.config.secret_ref)
        self.consumer = consumer(
            self.config, **{"enable.auto.offset.store": False, "auto.offset.reset": "error"}
        )
        self.cursors: dict[Split, int] = {}
        self.ends: dict[Split, int] | None = {} if self.config.bounded else None
        self.event_times: SplitHighs[Split] = SplitHighs()
        self._last_read: dict[Split, float] = {}
        self._discovered_at = self._started = clock()
        for split in self._splits(cluster):
            self.cursors[split] = self._start_offset(split)
            if self.ends is not None:
                self.ends[split] = self._watermarks(split)[1]
        self._assign()

    def _owns(self, split: Split) -> bool:
        """Partitions of a topic go round-robin from a subtask its name picks (as Flink's do)."""
        topic, partition = split
        return (stable_hash(topic) + partition) % self.parallelism == self.subtask

    def _splits(self, cluster: ClusterMetadata) -> list[Split]:
        """This subtask's partitions of the topic (or of the topics matching the pattern) in the
        cluster's metadata; StartRefused when the topic does not exist."""
        c = self.config
        if self._pattern is None:
            assert c.topic is not None  # the config has a topic or a pattern
            meta = cluster.topics.get(c.topic)
            if meta is None or meta.error is not None:
                raise StartRefused(f"kafka source: topic '{c.topic}' does not exist on {c.bootstrap_servers}")
            topics = {c.topic: meta}
        else:
            topics = {
                t: m for t, m in cluster.topics.items() if self._pattern.fullmatch(t) and m.error is None
            }
        every = ((t, p) for t, meta in topics.items() for p in meta.partitions)
        return sorted(split for split in every if self._owns(split))

    def _watermarks(self, split: Split) -> tuple[int, int]:
        low, high = self.consumer.get_watermark_offsets(TopicPartition(*split), timeout=TIMEOUT)
        return int(low), int(high)

    def _start_offset(self, split: Split) -> int:
        low, high = self._watermarks(split)
        if self.config.starting_offsets == "earliest":
            return low
        if self.config.starting_offsets == "latest":
            return high
        at = self.consumer.offsets_for_times(
            [TopicPartition(*split, self.config.start_timestamp_ms or 0)], timeout=TIMEOUT
        )[0]
        return int(at.offset) if at.offset >= 0 else high

    def _assign(self) -> None:
        todo = [s for s in self.cursors if not self._done(s)]
        self.consumer.assign([TopicPartition(*s, self.cursors[s]) for s in todo])

    def _done(self, split: Split) -> bool:
        return self.ends is not None and self.cursors[split] >= self.ends[split]

    def _discover(self) -> None:
        """New partitions (and, with a pattern, topics), never in bounded mode: read from their start."""
        interval = self.config.discovery_interval_ms
        if interval is None or self.ends is not None:
            return
        if self._clock() - self._discovered_at < interval / 1000:
            return
        self._discovered_at = self._clock()
        cluster = self.consumer.list_topics(self.config.topic, timeout=TIMEOUT)
        new = [s for s in self._splits(cluster) if s not in self.cursors]
        for split in new:
            self.cursors[split] = self._watermarks(split)[0]
        if new:
            self._assign()

    def _record(self, value: bytes | None, split: Split, offset: int) -> Any:
        """The record of a message value (None for none); one that does not decode is refused naming its
        partition and offset (`BadInput`), or, when the source keeps unreadable records, an `Unreadable`
        saying so."""
        if value is None:
            return None
        try:
            return self.codec.decode(value)
        except PayloadError as err:
            why = f"partition {split[1]} of topic '{split[0]}': the value at offset {offset} {err}"
            if not self.keep_unreadable:
                raise BadInput(why) from None  # the same in every run: refused, never retried
            return Unreadable(value.decode("utf-8", errors="replace"), why)

    def read(self, max_records: int) -> Batch | None:
        """Up to `max_records` committed records; None once every partition reached its end (bounded)."""
        if self.ends is not None and all(self._done(s) for s in self.cursors):
            return None
        self._discover()
        messages = self.consumer.consume(num_messages=max_records, timeout=0.05)
        records, stamps = [], []
        self.event_times.start()
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            split, offset = (str(m.topic()), int(m.partition() or 0)), int(m.offset() or 0)
            if self.ends is not None and offset >= self.ends[split]:
                continue  # past the bounded end
            records.append(self._record(m.value(), split, offset))
            stamps.append(_timestamp(m))
            self.cursors[split] = offset + 1
            self.event_times.note(split)
            self._last_read[split] = self._clock()
        if self.ends is not None:
            self._settle_positions()
        return Batch(records, stamps)

    def _settle_positions(self) -> None:
        """Move cursors over what read_committed skips (transaction markers, aborted records)."""
        assert self.ends is not None
        assigned = [TopicPartition(*s) for s in self.cursors if not self._done(s)]
        for tp in self.consumer.position(assigned) if assigned else []:
            split = (tp.topic, tp.partition)
            if tp.offset >= 0:
                self.cursors[split] = max(self.cursors[split], min(int(tp.offset), self.ends[split]))

    def split_highs(self, timestamps: list[int]) -> list[int]:
        """Each record's partition high before it (`SplitEventTime`)."""
        return self.event_times.highs_before(timestamps)

    def event_time_floor(self) -> int | None:
        """The lowest high over the partitions still read and not idle (`SplitEventTime`)."""
        now = self._clock()
        idle = self.idle_timeout_ms
        active = [
            s
            for s in self.cursors
            if not self._done(s)
            and not (idle is not None and now - self._last_read.get(s, self._started) >= idle / 1000)
        ]
        if not active:
            return None
        highs = self.event_times.highs
        return min(highs.get(s, MIN_TIMESTAMP) for s in active)

    def snapshot(self) -> dict[str, Any]:
        """The next offset of every partition known (`topic:partition`: each a split's cursor, stored at its
        own StatePath), the bounded ends, the event times."""
        state: dict[str, Any] = {
            "cursors": {_key(s): o for s, o in self.cursors.items()},
            "eventTimes": {_key(s): t for s, t in self.event_times.highs.items()},
        }
        if self.ends is not None:
            state["ends"] = {_key(s): e for s, e in self.ends.items()}
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """Resume every partition of this subtask at its offset (its end, when bounded, as first seen).

        A checkpoint written before the offsets were split cursors keeps them in `offsets`.
        """
        offsets = {**state.get("offsets", {}), **state.get("cursors", {})}
        mine = {_split(k): v for k, v in offsets.items() if self._owns(_split(k))}
        self.cursors.update({s: int(o) for s, o in mine.items()})
        if self.ends is not None:
            ends = {_split(k): int(e) for k, e in state.get("ends", {}).items()}
            self.ends.update({s: e for s, e in ends.items() if self._owns(s)})
        times = {_split(k): int(t) for k, t in state.get("eventTimes", {}).items()}
        self.event_times.highs = {s: t for s, t in times.items() if self._owns(s)}
        self._assign()

    def close(self) -> None:
        """Leave the broker."""
        self.consumer.close()


def _timestamp(m: Message) -> int:
    kind, ts = m.timestamp()
    return int(ts) if kind != 0 and ts >= 0 else int(time.time() * 1000)


_KEYS = PlainCodec("string")
"""Message keys: text as it is, anything else as JSON."""


class KafkaSink(StagedSink):
    """Publishes each durable epoch's records in one Kafka transaction with its marker."""

    def __init__(self, config: dict[str, Any], *, name: SinkName) -> None:
        """A sink subtask of a validated `KafkaSinkConfig`; the producer starts at `recover`."""
        super().__init__(name)
        self.config = KafkaSinkConfig.model_validate(config)
        self.sink_id = f"{self.txn_prefix}:{self.config.topic}"
        self._open: list[Any] = []
        self._producer: Producer | None = None
        self._marker: Consumer | None = None
        self._codec: ValueCodec | None = None
        self.published: tuple[int, int] = (0, 0)

    # the marker: a consumer group of the sink's own

    @property
    def marker(self) -> Consumer:
        """The consumer whose group holds the published epoch (its committed offset)."""
        if self._marker is None:
            self._marker = consumer(self.config, **{"group.id": f"nopstream.{self.sink_id}"})
        return self._marker

    def _read_marker(self) -> tuple[int, int]:
        """(lineage, epoch) of the last published epoch; (0, 0) before the first."""
        (tp,) = self.marker.committed([TopicPartition(self.config.topic, 0)], timeout=TIMEOUT)
        if tp.error is not None:
            raise KafkaException(tp.error)
        if tp.offset == OFFSET_INVALID or tp.offset < 0:
            return (0, 0)
        lineage = int((tp.metadata or "lineage=1").removeprefix("lineage="))
        return (lineage, int(tp.offset))

    @property
    def producer(self) -> Producer:
        """The transactional producer; `init_transactions` fenced every earlier one of this subtask."""
        if self._producer is None:
            producer = Producer(
                {
                    **client_config(self.config),
                    "transactional.id": f"nopstream.{self.sink_id}",
                    "transaction.timeout.ms": self.config.transaction_timeout_ms,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                }
            )
            producer.init_transactions(TIMEOUT)
            self._producer = producer
        return self._producer

    # writing

    @property
    def codec(self) -> ValueCodec:
        """The values' codec (set at `recover`)."""
        assert self._codec is not None, "recover comes first"
        return self._codec

    def write(self, batch: Batch) -> None:
        """Hold the batch in the open epoch (it reaches the snapshot at the barrier); a record its
        format cannot write is refused here, before any epoch holds it (`BadInput`)."""
        for record in batch.records:
            try:
                self.codec.encode(record)
            except PayloadError as err:
                shown = shown_record(record)
                raise BadInput(f"kafka sink '{self.name.operator_id}': the record {shown} {err}") from None
        self._open.extend(batch.records)
        self.records += len(batch.records)

    def _stage(self, epoch: int) -> None:
        """Nothing to write: the records are in the pending transaction, so in the snapshot."""

    def _staged_state(self) -> dict[str, Any]:
        return {"data": self._open}

    def prepare(self, epoch: int) -> None:
        """Barrier `epoch`: the open epoch's records become pending (snapshotted) and a new epoch opens."""
        super().prepare(epoch)
        self._open = []

    # publishing

    def _publish(self, epoch: int, lineage: int) -> None:
        if (lineage, epoch) <= self.published:
            return
        txn = next((t for t in self.pending if (t.lineage, t.epoch) == (lineage, epoch)), None)
        if txn is None:
            raise OutputConflict(f"transaction {self.txn_prefix}:{epoch} has no records in the snapshot")
        producer, c = self.producer, self.config
        producer.begin_transaction()
        for record in txn.staged["data"]:
            topic = str(record[c.topic_field]) if c.topic_field and isinstance(record, dict) else c.topic
            key = None
            if c.key_field is not None and isinstance(record, dict) and record.get(c.key_field) is not None:
                key = _KEYS.encode(record[c.key_field])
            while True:
                try:
                    producer.produce(topic, value=self.codec.encode(record), key=key)
                    break
                except BufferError:  # the local queue is full: let librdkafka send
                    producer.poll(0.05)
            producer.poll(0)
        marker = TopicPartition(c.topic, 0, epoch, f"lineage={lineage}")
        producer.send_offsets_to_transaction([marker], self.marker.consumer_group_metadata(), TIMEOUT)
        producer.commit_transaction(TIMEOUT)
        self.published = (lineage, epoch)

    # recovery

    def recover(self, start: SinkStart) -> SinkRecovery:
        """Fence earlier producers, read the marker, then the rule of every start (`StagedSink.recover`)."""
        self._open = []
        self._producer = None
        topics = reach(self.config, self.config.topic).topics
        if self.config.topic not in topics or topics[self.config.topic].error is not None:
            raise StartRefused(
                f"kafka sink '{self.name.operator_id}': topic '{self.config.topic}' does not exist on"
                f" {self.config.bootstrap_servers} (create it first)"
            )
        who = f"kafka sink '{self.name.operator_id}'"
        codec = value_codec(self.config, who, self.config.secret_ref)
        if isinstance(codec, RegistryCodec):
            codec.start_writing(self.config, who)
        self._codec = codec
        _ = self.producer  # init_transactions: fences a zombie, aborts what it left open
        self.published = self._read_marker()
        return super().recover(start)

    def _staged_txns(self) -> list[tuple[int, int]]:
        return []  # nothing is staged outside the snapshot: what a dead run held is gone with it

    def _committed_epochs(self) -> list[int]:
        lineage, epoch = self.published
        return [epoch] if lineage == self.lineage and epoch else []

    def _drop(self, lineage: int, epoch: int) -> None:
        """Nothing to abort."""

    def _where(self, epoch: int) -> str:
        c = self.config
        return f"kafka topic '{c.topic}' on {c.bootstrap_servers}, group nopstream.{self.sink_id}"

    def finish(self) -> None:
        """End of input: the open epoch waits for the final barrier."""


def create_like(config: dict[str, Any], topic: str) -> None:
    """Create `topic` with the partitions of the sink's topic (`nopstream chaos`: a run's own output)."""
    from confluent_kafka.cimpl import NewTopic

    c = KafkaSinkConfig.model_validate(config)
    meta = reach(c, c.topic).topics.get(c.topic)
    partitions = len(meta.partitions) if meta is not None and meta.error is None else 1
    client = admin(c)  # held until the futures are done: a destroyed client fails them
    for future in client.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(TIMEOUT)


def topic_records(config: dict[str, Any]) -> list[Any]:
    """Every committed record of the sink's topic, from the beginning (read_committed)."""
    c = KafkaSinkConfig.model_validate(config)
    codec = value_codec(c, f"kafka topic '{c.topic}'", c.secret_ref)
    reader = consumer(c)
    try:
        meta = reader.list_topics(c.topic, timeout=TIMEOUT).topics[c.topic]
        ends = {}
        for p in meta.partitions:
            _, ends[p] = reader.get_watermark_offsets(TopicPartition(c.topic, p), timeout=TIMEOUT)
        reader.assign([TopicPartition(c.topic, p, 0) for p in ends])
        out: list[Any] = []
        todo = {p for p, end in ends.items() if end > 0}
        while todo:
            for m in reader.consume(500, timeout=0.2):
                if m.error() is None:
                    value = m.value()
                    out.append(codec.decode(value) if value is not None else None)
            for tp in reader.position([TopicPartition(c.topic, p) for p in todo]):
                if tp.offset >= ends[tp.partition]:  # read_committed moves past markers and aborted records
                    todo.discard(tp.partition)
        return out
    finally:
        reader.close()


def delete_topic(config: dict[str, Any]) -> None:
    """Delete the sink's topic (`nopstream chaos`, once a run's output compared equal)."""
    c = KafkaSinkConfig.model_validate(config)
    client = admin(c)  # held until the futures are done
    for future in client.delete_topics([c.topic]).values():
        future.result(TIMEOUT)
