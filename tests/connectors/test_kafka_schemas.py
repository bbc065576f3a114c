"""Kafka values in Avro, Protobuf and JSON Schema with a real schema registry (Apicurio Registry,
its Confluent API): what the tests write in the wire format nopstream reads exactly, what the
sink writes decodes with the schema it registered, a schema change mid-stream is read on, and
every value, record, schema or registry that does not fit is refused in one line or set aside.
"""

from __future__ import annotations

import base64
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from nopstream.connectors import payloads
from nopstream.connectors.schema_registry import SchemaRegistryClient, frame, message_path, read_message_path
from nopstream.model.connectors import SchemaRegistry
from tests.chaos import jobs
from tests.checkpointing.test_faults import run_job
from tests.registry_util import avro_record, framed

PROTO = """
syntax = "proto3";
package shop;
message Envelope {
  message Order {
    string user = 1;
    int64 amount = 2;
    Kind kind = 3;
    bytes tag = 4;
    map<string, int32> counts = 5;
    Envelope.Order parent = 6;
  }
}
message Total { string key = 1; int64 value = 2; }
enum Kind { NONE = 0; GIFT = 1; }
"""

JSON_ORDER = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"user": {"type": "string"}, "amount": {"type": "integer", "minimum": 1}},
    "required": ["user", "amount"],
}


def run(home: Path, model: dict, env: dict | None = None):
    return run_job(jobs.prepare(home, model).parent, env=env)


def totals(orders: list[dict]) -> Counter:
    """What a running total per user publishes: every user's sums in order."""
    out, sums = Counter(), Counter()
    for o in orders:
        sums[o["user"]] += o["amount"]
        out[json.dumps({"key": o["user"], "value": sums[o["user"]]}, sort_keys=True)] += 1
    return out


def test_avro_both_ways_across_a_schema_change(tmp_path, kafka, registry):
    """Orders written with two schemas (the second registered mid-stream) into running totals the
    sink registers and writes in Avro: the exact totals, read back with the registry's schema."""
    model = jobs.kafka_avro_totals(tmp_path / "job", kafka=kafka, registry=registry)
    result = run(tmp_path / "job", model)
    assert result.returncode == 0, result.stderr
    source = model["model"]["sources"][0]["config"]["topic"]
    out = model["model"]["sinks"][0]["config"]["topic"]
    orders = [o for part in jobs.avro_orders() for o in part]
    # each order as its writer's schema has it: v1's without the fields v2 added
    assert kafka.committed(source, lambda v: avro_record(registry, v)) == Counter(
        json.dumps(o, sort_keys=True) for o in orders
    )
    assert kafka.committed(out, lambda v: avro_record(registry, v)) == totals(orders)
    assert registry.versions(f"{out}-value") == [1]
    assert json.loads(registry.latest(f"{out}-value")) == jobs.TOTAL


@pytest.mark.parametrize("fmt", ["protobuf", "json-schema"])
def test_protobuf_and_json_schema_both_ways(fmt, tmp_path, kafka, registry):
    """Orders into running totals written in the same format: exact, and what the sink wrote decodes
    by its id. Protobuf: a nested message (path [0, 0]) with an enum, bytes, a map, a message not
    set and 64-bit amounts, each as the job sees it."""
    topic, out = kafka.create(f"{fmt}-in"), kafka.create(f"{fmt}-out")
    rng = random.Random(5)
    orders = [{"user": f"u{rng.randrange(5)}", "amount": rng.randrange(1, 100)} for _ in range(400)]
    operators = [
        {"id": "paced", "type": "map", "fn": "chaosfns:slow"},
        {"id": "by-user", "type": "key_by", "key": {"field": "user"}},
        {"id": "total", "type": "aggregate", "aggregate": {"kind": "sum", "field": "amount"}},
    ]
    if fmt == "protobuf":
        schema_id = registry.register(f"{topic}-value", PROTO, "PROTOBUF")
        order_class = _proto_classes(PROTO)["shop.Envelope.Order"]
        values = []
        for o in orders:
            message = order_class(user=o["user"], amount=o["amount"] + 2**40, kind=1, tag=b"\x00\x01")
            message.counts["a"] = 3
            values.append(framed(schema_id, bytes([4, 0, 0]) + message.SerializeToString()))
        sink_schema = {"valueSchema": PROTO, "message": "shop.Total"}
        operators.insert(0, {"id": "seen", "type": "map", "fn": "schemafns:order"})
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / "schemafns.py").write_text(SCHEMA_FNS)
    else:
        schema_id = registry.register(f"{topic}-value", JSON_ORDER, "JSON")
        values = [framed(schema_id, json.dumps(o).encode()) for o in orders]
        total = {**JSON_ORDER, "properties": {"key": {"type": "string"}, "value": {"type": "integer"}}}
        sink_schema = {"valueSchema": json.dumps({**total, "required": ["key", "value"]})}
    kafka.produce(topic, values, raw=True)
    reg = {"format": fmt, "schemaRegistry": {"url": registry.url}}
    model = {
        "jobId": f"schemas-{fmt}",
        "checkpoint": {"intervalMs": 150},
        "model": {
            "sources": [
                {
                    "id": "orders",
                    "type": "kafka",
                    "config": {"bootstrapServers": kafka.bootstrap, "topic": topic, "bounded": True, **reg},
                }
            ],
            "operators": operators,
            "sinks": [
                {
                    "id": "out",
                    "type": "kafka",
                    "config": {"bootstrapServers": kafka.bootstrap, "topic": out, **reg, **sink_schema},
                }
            ],
        },
    }
    result = run(tmp_path / "job", model)
    assert result.returncode == 0, result.stderr
    codec = payloads.RegistryCodec(SchemaRegistryClient(SchemaRegistry(url=registry.url)), fmt)
    assert kafka.committed(out, codec.decode) == totals(orders)
    if fmt == "protobuf":
        seen = json.loads((tmp_path / "job" / "seen.json").read_text())
        assert seen == {
            "user": orders[0]["user"],
            "amount": orders[0]["amount"] + 2**40,
            "kind": "GIFT",
            "tag": base64.b64encode(b"\x00\x01").decode(),
            "counts": {"a": 3},
            "parent": None,
        }


SCHEMA_FNS = """
import json, os

def order(o):
    if not os.path.exists("seen.json"):
        with open("seen.json", "w") as f:
            json.dump(o, f)
    return {"user": o["user"], "amount": o["amount"] - 2**40}
"""


def _proto_classes(text: str) -> dict:
    """The message classes of a .proto file, compiled here by protoc apart from nopstream's codec."""
    import subprocess
    import sys
    import tempfile

    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "t.proto").write_text(text)
        include = Path(grpc_tools.__file__).parent / "_proto"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{tmp}",
                f"-I{include}",
                f"--descriptor_set_out={tmp}/o",
                "t.proto",
            ],
            check=True,
        )
        files = descriptor_pb2.FileDescriptorSet.FromString(Path(tmp, "o").read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    names = ["shop.Envelope.Order", "shop.Total"]
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(n)) for n in names}


def test_the_wire_format_of_message_paths():
    """A lone 0 is the first message; other paths are a zig-zag count then zig-zag indexes."""
    assert message_path([0]) == b"\x00"
    assert message_path([0, 0]) == bytes([4, 0, 0])
    assert message_path([1, 2]) == bytes([4, 2, 4])
    assert read_message_path(bytes([4, 2, 4]) + b"rest") == ([1, 2], b"rest")
    assert read_message_path(b"\x00rest") == ([0], b"rest")
    assert frame(7, b"x") == b"\x00\x00\x00\x00\x07x"
