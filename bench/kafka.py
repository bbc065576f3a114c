"""Kafka -> Kafka throughput: nopstream against plain confluent-kafka loops, as ratios of one run.

A broker of its own (KRaft, `e2e/servers.py`) holds an input topic of N JSON records
in 2 partitions (200,000 by default). Each contestant reads all of it, adds a field to
every record, and writes it to an output topic of its own; the time is the whole run
as a user sees it, until the last record is committed:
  plain EO     a consume-transform-produce loop: read_committed consumer, one Kafka
               transaction per 5,000 records with the consumer's offsets sent in it
  plain ALO    the same loop without transactions, offsets committed after each batch
  nopstream    `nopstream run` of a bounded kafka source -> map -> kafka sink job,
               STRICT_EXACTLY_ONCE (checkpoints every second), and AT_LEAST_ONCE
Ratios: nopstream exactly-once / plain EO (target >= 0.3) and nopstream at-least-once /
plain ALO. Every output is checked to hold each record once.
Run: `python bench/kafka.py [--records N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from e2e import servers
from tests.kafka_util import QUIET, Topics

ROOT = Path(__file__).resolve().parent.parent
FNS = """
def tag(record):
    return {**record, "seen": True}
"""
BATCH = 5_000


def fill(topics: Topics, records: int) -> str:
    """The input topic: `records` JSON records over 2 partitions."""
    topic = topics.create("in", partitions=2)
    producer = Producer({"bootstrap.servers": topics.bootstrap, "linger.ms": 20, **QUIET})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=orjson.dumps({"i": i, "text": f"record {i}"}), partition=i % 2)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    return topic


def plain_loop(topics: Topics, source: str, out: str, records: int, *, transactions: bool) -> float:
    """Seconds for a consume-transform-produce loop to copy the topic (with or without transactions)."""
    start = time.perf_counter()
    consumer = Consumer(
        {
            "bootstrap.servers": topics.bootstrap,
            "group.id": f"plain-{out}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            **QUIET,
        }
    )
    config = {"bootstrap.servers": topics.bootstrap, "linger.ms": 5, **QUIET}
    if transactions:
        config["transactional.id"] = f"plain-{out}"
    producer = Producer(config)
    if transactions:
        producer.init_transactions(30)
    consumer.assign([TopicPartition(source, p, 0) for p in range(2)])
    done = 0
    while done < records:
        messages = [m for m in consumer.consume(BATCH, timeout=1.0) if m.error() is None]
        if not messages:
            continue
        if transactions:
            producer.begin_transaction()
        for m in messages:
            record = orjson.loads(m.value())
            while True:
                try:
                    producer.produce(out, value=orjson.dumps({**record, "seen": True}))
                    break
                except BufferError:
                    producer.poll(0.05)
        done += len(messages)
        if transactions:
            offsets = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            consumer.commit(asynchronous=True)
    producer.flush(30)
    consumer.close()
    return time.perf_counter() - start


def nopstream(workdir: Path, topics: Topics, source: str, out: str, mode: str) -> float:
    """Seconds of `nopstream run` of the job, as a user runs it."""
    home = workdir / mode
    home.mkdir()
    (home / "benchfns.py").write_text(FNS)
    job = {
        "jobId": f"bench-{mode.lower().replace('_', '-')}",
        "semanticMode": mode,
        "checkpoint": {"intervalMs": 1000, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [
                {
                    "id": "in",
                    "type": "kafka",
                    "config": {"bootstrapServers": topics.bootstrap, "topic": source, "bounded": True},
                }
            ],
            "operators": [{"id": "tag", "type": "map", "fn": "benchfns:tag"}],
            "sinks": [
                {"id": "out", "type": "kafka", "config": {"bootstrapServers": topics.bootstrap, "topic": out}}
            ],
        },
    }
    (home / "job.yaml").write_text(yaml.safe_dump(job))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(home)])}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "nopstream", "run", "job.yaml"],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"nopstream {mode} failed (exit {done.returncode}):\n{done.stderr}")
    return time.perf_counter() - start


def check(topics: Topics, out: str, records: int) -> None:
    """The output holds every input record once, tagged."""
    got = topics.committed(out)
    expected = {
        json.dumps({"i": i, "seen": True, "text": f"record {i}"}, sort_keys=True) for i in range(records)
    }
    if set(got) != expected or any(n != 1 for n in got.values()):
        raise SystemExit(f"{out}: {sum(got.values())} records, {len(expected)} expected once each")


def main() -> None:
    """Measure and print the ratios."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    n = args.records
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        broker = servers.start_kafka(workdir / "broker")
        try:
            topics = Topics(broker.bootstrap, "bench")
            source = fill(topics, n)
            seconds = {}
            for name, run in (
                ("plain EO", lambda out: plain_loop(topics, source, out, n, transactions=True)),
                ("plain ALO", lambda out: plain_loop(topics, source, out, n, transactions=False)),
                ("nopstream EO", lambda out: nopstream(workdir, topics, source, out, "STRICT_EXACTLY_ONCE")),
                ("nopstream ALO", lambda out: nopstream(workdir, topics, source, out, "AT_LEAST_ONCE")),
            ):
                out = topics.create(name.replace(" ", "-").lower(), partitions=2)
                seconds[name] = run(out)
                check(topics, out, n)
        finally:
            broker.stop()
    print(f"Kafka -> Kafka, {n:,} JSON records in 2 partitions, a field added to each; whole runs")
    for name, s in seconds.items():
        print(f"  {name:<14} {n / s:>10,.0f} records/s  ({s:.2f} s)")
    print(
        f"  nopstream EO / plain EO:   {seconds['plain EO'] / seconds['nopstream EO']:.3f}  (target >= 0.3)"
    )
    print(f"  nopstream ALO / plain ALO: {seconds['plain ALO'] / seconds['nopstream ALO']:.3f}")


if __name__ == "__main__":
    main()
