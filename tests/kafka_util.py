"""Topics and records on a test broker: create, produce (also in transactions), read committed."""

from __future__ import annotations

import json
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

QUIET = {"log_level": 2}
SETTLE_S = 5.0
"""How long `Topics.committed` waits for the partitions' stable offsets to reach their ends."""


class Topics:
    """The test's view of one broker."""

    def __init__(self, bootstrap: str, test_name: str) -> None:
        self.bootstrap = bootstrap
        self.prefix = re.sub(r"[^a-z0-9]", "-", test_name.lower())[:60]
        self.admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})

    def create(self, name: str, partitions: int = 1) -> str:
        """A new topic named after the test, whose records are never deleted for their age; its full name."""
        topic = f"{self.prefix}-{name}-{secrets.token_hex(3)}"
        # Tests stamp records near 1970, far past the default 7 days of retention: the broker
        # deleted the segments it had rolled at its next retention check (seen: a partition of
        # 20,000 records beginning at offset 3,109; a window count getting half its input, then
        # none, in CI dry runs). Records must stay for as long as a test reads them.
        keep = {"retention.ms": "-1"}
        for future in self.admin.create_topics([NewTopic(topic, partitions, 1, config=keep)]).values():
            future.result(30)
        self._wait_until_served(topic, partitions)
        return topic

    def _wait_until_served(self, topic: str, partitions: int) -> None:
        """Until the broker's metadata shows every partition of `topic` with a leader.

        A created topic is committed by the controller before the broker serves it: a
        client asking at once was told it does not exist (a CI dry run's sink refused to
        start so)."""
        deadline = time.monotonic() + 30
        while True:
            found = self.admin.list_topics(topic, timeout=10).topics.get(topic)
            leaders = [] if found is None or found.error else [p.leader for p in found.partitions.values()]
            if len(leaders) == partitions and min(leaders) >= 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} is not served 30 s after it was created")
            time.sleep(0.05)

    def produce(
        self,
        topic: str,
        values: list[Any],
        *,
        partition: int | None = None,
        transactional: str | None = None,
        abort: bool = False,
        timestamp: int | list[int] | None = None,
        raw: bool = False,
    ) -> None:
        """JSON values (with `raw`, bytes as they are) to a topic; in one transaction (aborted when `abort`)
        when `transactional` names it."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap, **QUIET}
        if transactional:
            config["transactional.id"] = transactional
        producer = Producer(config)
        if transactional:
            producer.init_transactions(30)
            producer.begin_transaction()
        failed: list[Any] = []

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                failed.append(error)

        for i, v in enumerate(values):
            extra: dict[str, Any] = {"on_delivery": delivered}
            if partition is not None:
                extra["partition"] = partition
            if timestamp is not None:
                extra["timestamp"] = timestamp[i] if isinstance(timestamp, list) else timestamp
            while True:
                try:
                    producer.produce(topic, value=v if raw else json.dumps(v).encode(), **extra)
                    break
                except BufferError:  # the local queue is full: let it send
                    producer.poll(0.05)
        # in the log before an abort, so that readers have aborted records to skip; and all of it:
        # a flush that timed out would lose records here without a word
        left = producer.flush(120)
        if left or failed:
            raise RuntimeError(f"test producer: {left} records not sent, {len(failed)} failed: {failed[:3]}")
        if transactional:
            (producer.abort_transaction if abort else producer.commit_transaction)(30)

    def committed(self, topic: str, decode: Callable[[bytes], Any] = json.loads) -> Counter[str]:
        """Every committed record of the topic (read_committed, from the beginning), as `decode` reads
        its value, in canonical JSON."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"reader-{secrets.token_hex(4)}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                **QUIET,
            }
        )
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        parts = [TopicPartition(topic, p, 0) for p in meta.partitions]
        ends = self._stable_ends(consumer, parts)
        consumer.assign(parts)
        out: Counter[str] = Counter()
        done = {p for p, e in ends.items() if e == 0}
        while len(done) < len(ends):
            for m in consumer.consume(500, timeout=0.5):
                if m.error() is None:
                    out[json.dumps(decode(m.value()), sort_keys=True)] += 1
            for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:  # read_committed moves past markers and aborted records
                    done.add(tp.partition)
        consumer.close()
        return out

    def _stable_ends(self, consumer: Consumer, parts: list[TopicPartition]) -> dict[int, int]:
        """Each partition's last stable offset, as a read_committed `consumer` is told it, once it reached
        where the log ended before (or SETTLE_S passed): a transaction's commit returns before the broker
        writes its markers to the partitions (a CI run read an epoch just committed as nothing), and a
        transaction left open holds it back until it ends."""
        every = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "ends",
                "isolation.level": "read_uncommitted",
                **QUIET,
            }
        )
        try:
            logs = {tp.partition: every.get_watermark_offsets(tp, timeout=30)[1] for tp in parts}
        finally:
            every.close()
        deadline = time.monotonic() + SETTLE_S
        while True:
            stable = {tp.partition: consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in parts}
            if all(stable[p] >= end for p, end in logs.items()) or time.monotonic() >= deadline:
                return stable
            time.sleep(0.05)
