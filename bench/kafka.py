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
  SASL_SSL + Avro  the same exactly-once pair with both ends over SASL_SSL (SCRAM-SHA-512,
               the broker verified) and Avro values in the schema registry's wire format
               (Apicurio Registry): the plain loop decodes each value with fastavro by the
               schema its id names (read once) and encodes with the output schema it
               registered; nopstream's job says `format: avro` at both ends.
Ratios: nopstream exactly-once / plain EO (target >= 0.3), nopstream at-least-once /
plain ALO, and the same exactly-once ratio over SASL_SSL with Avro. Every output is
checked to hold each record once.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from e2e import servers
from e2e.certs import Pki
from tests.kafka_util import QUIET, Topics
from tests.registry_util import Registry, avro_record, avro_value

ROOT = Path(__file__).resolve().parent.parent
FNS = """
def tag(record):
    return {**record, "seen": True}
"""
BATCH = 5_000
RECORD = {
    "type": "record",
    "name": "Record",
    "fields": [{"name": "i", "type": "long"}, {"name": "text", "type": "string"}],
}
TAGGED = {**RECORD, "fields": [*RECORD["fields"], {"name": "seen", "type": "boolean"}]}
PASSWORD = "bench-password"


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


@dataclass(frozen=True)
class Wire:
    """How the contestants reach the broker and read and write values: the client settings of a
    plain loop, its value codec, and the same as a job's connector settings."""

    client: dict[str, Any]
    decode: Callable[[bytes], Any]
    encode: Callable[[Any], bytes]
    job: dict[str, Any]
    sink_job: dict[str, Any]


PLAIN = Wire({}, orjson.loads, orjson.dumps, {}, {})
"""PLAINTEXT and JSON."""


def fill_avro(topics: Topics, registry: Registry, records: int) -> str:
    """The input topic in Avro: `records` records of `RECORD` over 2 partitions."""
    topic = topics.create("avro-in", partitions=2)
    schema_id = registry.register(f"{topic}-value", RECORD)
    for part in range(2):
        values = [
            avro_value(schema_id, RECORD, {"i": i, "text": f"record {i}"}) for i in range(part, records, 2)
        ]
        topics.produce(topic, values, partition=part, raw=True)
    return topic


def avro_wire(auth: servers.KafkaAuth, registry: Registry, out: str) -> Wire:
    """SASL_SSL both ways; values decoded by their schema id (each schema read once) and encoded with
    `TAGGED`, registered for the topic `out`."""
    import io

    import fastavro

    readers: dict[int, Any] = {}
    out_id, tagged = registry.register(f"{out}-value", TAGGED), fastavro.parse_schema(TAGGED)

    def decode(value: bytes) -> Any:
        schema_id = int.from_bytes(value[1:5], "big")
        if schema_id not in readers:
            readers[schema_id] = fastavro.parse_schema(json.loads(registry.schema(schema_id)))
        return fastavro.schemaless_reader(io.BytesIO(value[5:]), readers[schema_id], None)

    def encode(record: Any) -> bytes:
        buffer = io.BytesIO()
        buffer.write(b"\x00" + out_id.to_bytes(4, "big"))
        fastavro.schemaless_writer(buffer, tagged, record)
        return buffer.getvalue()

    client = {
        "bootstrap.servers": auth.sasl_bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "bench",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(auth.ca),
    }
    job = {
        "bootstrapServers": auth.sasl_bootstrap,
        "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": "SCRAM-SHA-512", "username": "bench"},
        "tls": {"caFile": str(auth.ca)},
        "format": "avro",
        "schemaRegistry": {"url": registry.url},
    }
    return Wire(client, decode, encode, job, {"valueSchema": json.dumps(TAGGED)})


def plain_loop(
    topics: Topics, source: str, out: str, records: int, *, transactions: bool, wire: Wire = PLAIN
) -> float:
    """Seconds for a consume-transform-produce loop to copy the topic (with or without transactions)."""
    start = time.perf_counter()
    consumer = Consumer(
        {
            **wire.client,
            "bootstrap.servers": wire.client.get("bootstrap.servers", topics.bootstrap),
            "group.id": f"plain-{out}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            **QUIET,
        }
    )
    config = {"bootstrap.servers": topics.bootstrap, "linger.ms": 5, **QUIET, **wire.client}
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
            record = wire.decode(m.value())
            while True:
                try:
                    producer.produce(out, value=wire.encode({**record, "seen": True}))
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


def nopstream(
    workdir: Path,
    topics: Topics,
    source: str,
    out: str,
    mode: str,
    *,
    wire: Wire = PLAIN,
    env: dict[str, str] | None = None,
) -> float:
    """Seconds of `nopstream run` of the job, as a user runs it."""
    home = workdir / (mode + ("-avro" if wire.job else ""))
    home.mkdir()
    (home / "benchfns.py").write_text(FNS)
    reach = {"bootstrapServers": topics.bootstrap}
    job = {
        "jobId": f"bench-{mode.lower().replace('_', '-')}",
        "semanticMode": mode,
        "checkpoint": {"intervalMs": 1000, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [
                {
                    "id": "in",
                    "type": "kafka",
                    "config": {**reach, "topic": source, "bounded": True, **wire.job},
                }
            ],
            "operators": [{"id": "tag", "type": "map", "fn": "benchfns:tag"}],
            "sinks": [
                {
                    "id": "out",
                    "type": "kafka",
                    "config": {**reach, "topic": out, **wire.job, **wire.sink_job},
                }
            ],
        },
    }
    (home / "job.yaml").write_text(yaml.safe_dump(job))
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT), str(home)])}
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


def check(topics: Topics, out: str, records: int, decode: Callable[[bytes], Any] = json.loads) -> None:
    """The output holds every input record once, tagged."""
    got = topics.committed(out, decode)
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
        auth = servers.KafkaAuth.issue(Pki(workdir / "pki"), {"bench": PASSWORD})
        broker = servers.start_kafka(workdir / "broker", auth=auth)
        server = servers.start_schema_registry(workdir / "registry")
        try:
            topics, registry = Topics(broker.bootstrap, "bench"), Registry(server.url)
            source = fill(topics, n)
            avro_source = fill_avro(topics, registry, n)
            secret = {"NOPSTREAM_KAFKA_PASSWORD": PASSWORD}
            seconds = {}
            for name, run in (
                ("plain EO", lambda out: plain_loop(topics, source, out, n, transactions=True)),
                ("plain ALO", lambda out: plain_loop(topics, source, out, n, transactions=False)),
                ("nopstream EO", lambda out: nopstream(workdir, topics, source, out, "STRICT_EXACTLY_ONCE")),
                ("nopstream ALO", lambda out: nopstream(workdir, topics, source, out, "AT_LEAST_ONCE")),
                (
                    "plain EO avro",
                    lambda out: plain_loop(
                        topics, avro_source, out, n, transactions=True, wire=avro_wire(auth, registry, out)
                    ),
                ),
                (
                    "nopstream EO avro",
                    lambda out: nopstream(
                        workdir,
                        topics,
                        avro_source,
                        out,
                        "STRICT_EXACTLY_ONCE",
                        wire=avro_wire(auth, registry, out),
                        env=secret,
                    ),
                ),
            ):
                out = topics.create(name.replace(" ", "-").lower(), partitions=2)
                seconds[name] = run(out)
                check(topics, out, n, (lambda v: avro_record(registry, v)) if "avro" in name else json.loads)
        finally:
            server.stop()
            broker.stop()
    print(f"Kafka -> Kafka, {n:,} records in 2 partitions, a field added to each; whole runs")
    for name, s in seconds.items():
        print(f"  {name:<18} {n / s:>10,.0f} records/s  ({s:.2f} s)")
    print(
        f"  nopstream EO / plain EO:   {seconds['plain EO'] / seconds['nopstream EO']:.3f}  (target >= 0.3)"
    )
    print(f"  nopstream ALO / plain ALO: {seconds['plain ALO'] / seconds['nopstream ALO']:.3f}")
    avro = seconds["plain EO avro"] / seconds["nopstream EO avro"]
    print(f"  SASL_SSL + Avro, nopstream EO / plain EO: {avro:.3f}")


if __name__ == "__main__":
    main()
