"""Kafka values in Avro, Protobuf and JSON Schema with a real schema registry (Apicurio Registry,
its Confluent API): what the tests write in the wire format nopstream reads exactly, what the
sink writes decodes with the schema it registered, a schema change mid-stream is read on, and
every value, record, schema or registry that does not fit is refused in one line or set aside.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import os
import random
import uuid
from collections import Counter
from pathlib import Path

import fastavro
import pytest

from nopstream.connectors import payloads
from nopstream.connectors.schema_registry import (
    KINDS,
    SchemaRegistryClient,
    frame,
    message_path,
    read_message_path,
)
from nopstream.model.connectors import SchemaRegistry
from tests.chaos import jobs
from tests.checkpointing.test_faults import run_job
from tests.conftest import REGISTRY_CLIENT
from tests.kafka_util import Topics
from tests.registry_util import Registry, avro_record, avro_value, framed

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
    # the sink's two subtasks registered it (racing, Apicurio may keep the same schema as two versions)
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
    model = _topic_to_topic(f"schemas-{fmt}", kafka, topic, out, reg, sink_schema, operators)
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


MONEY = {
    "protobuf": 'syntax = "proto3";\npackage shop;\nmessage Money { string currency = 1; int64 cents = 2; }',
    "avro": json.dumps(
        {"type": "record", "name": "Money", "namespace": "shop",
         "fields": [{"name": "currency", "type": "string"}, {"name": "cents", "type": "long"}]}
    ),
    "json-schema": json.dumps(
        {"type": "object", "required": ["currency", "cents"],
         "properties": {"currency": {"type": "string"}, "cents": {"type": "integer"}}}
    ),
}  # fmt: skip
PRICED = {
    "protobuf": (
        'syntax = "proto3";\npackage shop;\nimport "money.proto";\n'
        "message Order { string id = 1; Money price = 2; }\n"
    ),
    "avro": json.dumps(
        {"type": "record", "name": "Order", "namespace": "shop",
         "fields": [{"name": "id", "type": "string"}, {"name": "price", "type": "shop.Money"}]}
    ),
    "json-schema": json.dumps(
        {"type": "object", "required": ["id", "price"],
         "properties": {"id": {"type": "string"}, "price": {"$ref": "money.json"}}}
    ),
}  # fmt: skip
IMPORTED_AS = {"protobuf": "money.proto", "avro": "shop.Money", "json-schema": "money.json"}
"""The name each format's schema imports the money schema by."""


@pytest.mark.parametrize("fmt", ["protobuf", "avro", "json-schema"])
def test_schemas_that_import_others_are_read_and_written_with_their_references(
    fmt, tmp_path, kafka, registry
):
    """Orders whose schema imports another (a Protobuf `import`, an Avro named type, a JSON Schema
    `$ref`), registered with its reference as a producer's serializer does: the source reads each value
    with the imported schema at hand, the sink registers its schema with the same reference and writes;
    the records exact, decoded by the test's own code (Protobuf, Avro) and by a fresh client."""
    kind = KINDS[fmt]
    topic, out = kafka.create(f"priced-{fmt}"), kafka.create(f"priced-{fmt}-out")
    registry.register(f"{topic}-money", MONEY[fmt], kind)
    reference = {"name": IMPORTED_AS[fmt], "subject": f"{topic}-money", "version": 1}
    schema_id = registry.register(f"{topic}-value", PRICED[fmt], kind, [reference])
    orders = [{"id": f"o{i}", "price": {"currency": "EUR", "cents": 100 + i}} for i in range(20)]
    if fmt == "protobuf":
        order = _proto_classes(PRICED[fmt], {"money.proto": MONEY[fmt]}, ["shop.Order"])["shop.Order"]
        values = [framed(schema_id, b"\x00" + order(**o).SerializeToString()) for o in orders]

        def decode(value: bytes) -> dict:
            assert value[5] == 0, value[:8]  # the first message's path
            got = order.FromString(value[6:])
            return {"id": got.id, "price": {"currency": got.price.currency, "cents": got.price.cents}}
    elif fmt == "avro":
        named: dict = {}
        fastavro.parse_schema(json.loads(MONEY[fmt]), named_schemas=named)
        parsed = fastavro.parse_schema(json.loads(PRICED[fmt]), named_schemas=named)
        values = [avro_value(schema_id, parsed, o) for o in orders]

        def decode(value: bytes) -> dict:
            return fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed, None)
    else:
        values = [framed(schema_id, json.dumps(o).encode()) for o in orders]

        def decode(value: bytes) -> dict:
            return json.loads(value[5:])

    kafka.produce(topic, values, raw=True)
    reg = {"format": fmt, "schemaRegistry": {"url": registry.url}}
    sink = {"valueSchema": PRICED[fmt], "references": [reference]}
    if fmt == "protobuf":
        sink["message"] = "shop.Order"
    model = _topic_to_topic(f"references-{fmt}", kafka, topic, out, reg, sink)
    result = run(tmp_path / "job", model)
    assert result.returncode == 0, result.stderr
    expected = Counter(json.dumps(o, sort_keys=True) for o in orders)
    assert kafka.committed(out, decode) == expected
    codec = payloads.RegistryCodec(SchemaRegistryClient(SchemaRegistry(url=registry.url)), fmt)
    assert kafka.committed(out, codec.decode) == expected
    assert registry.references(f"{out}-value") == [reference]


def _topic_to_topic(
    job_id: str, kafka: Topics, topic: str, out: str, reg: dict, sink: dict, operators: list | None = None
) -> dict:
    """A job from the bounded topic `topic` through `operators` into `out`, both ends with `reg`'s
    format and registry, the sink with `sink`'s settings."""
    return {
        "jobId": job_id,
        "checkpoint": {"intervalMs": 150},
        "model": {
            "sources": [
                {
                    "id": "orders",
                    "type": "kafka",
                    "config": {"bootstrapServers": kafka.bootstrap, "topic": topic, "bounded": True, **reg},
                }
            ],
            "operators": operators or [],
            "sinks": [
                {
                    "id": "out",
                    "type": "kafka",
                    "config": {"bootstrapServers": kafka.bootstrap, "topic": out, **reg, **sink},
                }
            ],
        },
    }


SCHEMA_FNS = """
import json, os

def order(o):
    if not os.path.exists("seen.json"):
        with open("seen.json", "w") as f:
            json.dump(o, f)
    return {"user": o["user"], "amount": o["amount"] - 2**40}
"""


def _proto_classes(text: str, imports: dict | None = None, names: list | None = None) -> dict:
    """The message classes of a .proto file (the files it imports beside it), compiled here by protoc
    apart from nopstream's codec."""
    import subprocess
    import sys
    import tempfile

    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "t.proto").write_text(text)
        for name, imported in (imports or {}).items():
            Path(tmp, name).write_text(imported)
        include = Path(grpc_tools.__file__).parent / "_proto"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{tmp}",
                f"-I{include}",
                f"--descriptor_set_out={tmp}/o",
                "--include_imports",
                "t.proto",
            ],
            check=True,
        )
        files = descriptor_pb2.FileDescriptorSet.FromString(Path(tmp, "o").read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    names = names or ["shop.Envelope.Order", "shop.Total"]
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(n)) for n in names}


def test_the_wire_format_of_message_paths():
    """A lone 0 is the first message; other paths are a zig-zag count then zig-zag indexes."""
    assert message_path([0]) == b"\x00"
    assert message_path([0, 0]) == bytes([4, 0, 0])
    assert message_path([1, 2]) == bytes([4, 2, 4])
    assert read_message_path(bytes([4, 2, 4]) + b"rest") == ([1, 2], b"rest")
    assert read_message_path(b"\x00rest") == ([0], b"rest")
    assert frame(7, b"x") == b"\x00\x00\x00\x00\x07x"


def test_values_that_do_not_decode_are_refused_or_set_aside(tmp_path, kafka, registry):
    """A value not in the wire format, one whose schema id the registry does not have, one with bytes
    after its record: the run is refused at the first, naming partition and offset; with
    `onError: dead-letter` each is set aside with its reason and the good ones are read."""
    topic, out = kafka.create("mixed"), kafka.create("good")
    schema_id = registry.register(f"{topic}-value", jobs.ORDER_V1)
    good = [{"user": "a", "amount": n} for n in range(1, 6)]
    values = [avro_value(schema_id, jobs.ORDER_V1, o) for o in good]
    kafka.produce(topic, [*values[:2], b'{"user": "a"}', framed(999_999, b"\x02a\x02")], raw=True)
    kafka.produce(topic, [values[2] + b"\x07", *values[2:]], raw=True)

    def model(on_error: str) -> dict:
        reg = {"format": "avro", "schemaRegistry": {"url": registry.url}}
        source = {"bootstrapServers": kafka.bootstrap, "topic": topic, "bounded": True, **reg}
        sink = {"bootstrapServers": kafka.bootstrap, "topic": out}
        dead = [{"id": "bad", "type": "file", "inputs": ["orders:dead-letter"], "config": {"path": "bad"}}]
        return {
            "jobId": f"mixed-{on_error}",
            "checkpoint": {"intervalMs": 150},
            "model": {
                "sources": [{"id": "orders", "type": "kafka", "config": source, "onError": on_error}],
                "operators": [],
                "sinks": [{"id": "out", "type": "kafka", "inputs": ["orders"], "config": sink}]
                + dead * (on_error == "dead-letter"),
            },
        }

    result = run(tmp_path / "fail", model("fail"))
    assert result.returncode == 3, result.stderr
    where = f"partition 0 of topic '{topic}': the value at offset"
    assert (
        f"{where} 2 is not in the schema registry's wire format: it does not start with byte 0 and a 4-byte"
        " schema id" in result.stderr
    )
    assert "Traceback" not in result.stderr and "recovering:" not in result.stderr
    assert kafka.committed(out) == Counter()
    result = run(tmp_path / "dead", model("dead-letter"))
    assert result.returncode == 0, result.stderr
    assert kafka.committed(out) == Counter(json.dumps(o, sort_keys=True) for o in good)
    letters = [
        json.loads(line)
        for f in sorted((tmp_path / "dead" / "bad").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    reasons = sorted(r["error"] for r in letters)
    assert reasons[0].startswith(f"{where} 2 is not in the schema registry's wire format")
    assert reasons[1].startswith(
        f"{where} 3 has schema id 999999, which the registry does not have (HTTP 404"
    )
    assert reasons[2] == f"{where} 4 has 1 bytes left after the value its Avro schema reads"
    assert len(letters) == 3


def _sink_model(kafka: Topics, registry: Registry, out: str, sink: dict, fmt: str = "avro") -> dict:
    """Five orders from a JSON topic into the Kafka sink `out` of `fmt` with `sink`'s settings."""
    topic = kafka.create("orders")
    kafka.produce(topic, [{"key": "a", "value": n} for n in range(5)])
    reg = {"format": fmt, "schemaRegistry": {"url": registry.url}}
    return {
        "jobId": "sink-refusals",
        "checkpoint": {"intervalMs": 150},
        "model": {
            "sources": [
                {
                    "id": "in",
                    "type": "kafka",
                    "config": {"bootstrapServers": kafka.bootstrap, "topic": topic, "bounded": True},
                }
            ],
            "operators": [],
            "sinks": [
                {
                    "id": "out",
                    "type": "kafka",
                    "config": {"bootstrapServers": kafka.bootstrap, "topic": out, **reg, **sink},
                }
            ],
        },
    }


def _refused(tmp_path: Path, model: dict, kafka: Topics, out: str, env: dict | None = None) -> str:
    result = run(tmp_path / "job", model, env)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "recovering:" not in result.stderr
    assert kafka.committed(out) == Counter()
    return result.stderr


def test_a_record_the_sink_schema_does_not_fit_is_refused_before_any_epoch_holds_it(
    tmp_path, kafka, registry
):
    out = kafka.create("out")
    schema = {
        **jobs.TOTAL,
        "fields": [{"name": "key", "type": "string"}, {"name": "value", "type": "string"}],
    }
    err = _refused(
        tmp_path, _sink_model(kafka, registry, out, {"valueSchema": json.dumps(schema)}), kafka, out
    )
    line = "kafka sink 'out': the record " + '{"key":"a","value":0}'
    line += " does not fit the Avro schema: must be string on field value"
    assert line in err


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "incompatible",
            "refused subject '{out}-value': HTTP 409: Incompatible artifact: {out}-value [AVRO]",
        ),
        (
            "not-avro",
            "kafka sink 'out': valueSchema: not an Avro schema: it names the unknown type 'shop.strin'",
        ),
        ("no-subject", "kafka sink 'out': schema registry at {url} refused subject '{out}-value': HTTP 404"),
        (
            "not-proto",
            "kafka sink 'out': valueSchema: not a .proto file protoc compiles: 1:10:"
            ' Unrecognized syntax identifier "proto9"',
        ),
        (
            "unreachable",
            "kafka sink 'out': schema registry at http://127.0.0.1:{port}/apis/ccompat/v7 cannot be used:",
        ),
    ],
)
def test_a_sink_schema_the_registry_or_its_library_refuses_is_refused_at_start(
    case, expected, tmp_path, kafka, registry
):
    from e2e.servers import free_port

    out, port = kafka.create("out"), free_port()
    fmt, sink, reg = "avro", {"valueSchema": json.dumps(jobs.TOTAL)}, registry
    if case == "incompatible":
        registry.register(f"{out}-value", jobs.ORDER_V1)
        registry.compatibility(f"{out}-value", "BACKWARD")
    elif case == "not-avro":
        sink = {"valueSchema": json.dumps({**jobs.TOTAL, "fields": [{"name": "key", "type": "strin"}]})}
    elif case == "no-subject":
        sink = {}
    elif case == "not-proto":
        fmt, sink = "protobuf", {"valueSchema": 'syntax = "proto9";'}
    elif case == "unreachable":
        reg = Registry(f"http://127.0.0.1:{port}/apis/ccompat/v7")
    err = _refused(tmp_path, _sink_model(kafka, reg, out, sink, fmt), kafka, out)
    assert expected.format(out=out, url=registry.url, port=port) in err, err
    assert len([line for line in err.splitlines() if "kafka sink 'out'" in line]) == 1


def test_a_registry_format_without_a_registry_is_refused_by_validation(tmp_path, nopstream):
    job = {
        "jobId": "no-registry",
        "model": {
            "sources": [
                {
                    "id": "in",
                    "type": "kafka",
                    "config": {"bootstrapServers": "127.0.0.1:1", "topic": "t", "format": "avro"},
                }
            ],
            "operators": [],
            "sinks": [
                {
                    "id": "out",
                    "type": "kafka",
                    "config": {"bootstrapServers": "127.0.0.1:1", "topic": "u", "subject": "s"},
                }
            ],
        },
    }
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    result = nopstream("validate", str(tmp_path / "job.yaml"))
    assert result.code != 0
    assert "format avro needs schemaRegistry (its schemas are kept there)" in result.err
    assert "subject goes with format avro, protobuf or json-schema, not json" in result.err


def test_a_registry_over_tls_is_verified(tmp_path, kafka):
    """A registry that serves only HTTPS: the sink verifies it against `tls.caFile` and writes; a
    registry whose certificate another CA signed is refused at start in one line."""
    from e2e import servers
    from e2e.certs import Pki

    pki = Pki(tmp_path / "pki")
    serving = pki.issue("registry", "registry", server_ips=("127.0.0.1",), client=False)
    server = servers.start_schema_registry(tmp_path / "registry", serving=serving)
    try:
        assert server.url.startswith("https://")
        for ca, ok in ((pki.ca.cert, True), (Pki(tmp_path / "other").ca.cert, False)):
            out = kafka.create("out")
            secure = Registry(server.url)
            model = _sink_model(kafka, secure, out, {"valueSchema": json.dumps(jobs.TOTAL)})
            model["model"]["sinks"][0]["config"]["schemaRegistry"]["tls"] = {"caFile": str(ca)}
            home = tmp_path / ("good" if ok else "bad")
            if ok:
                result = run(home, model)
                assert result.returncode == 0, result.stderr
                client = SchemaRegistryClient(SchemaRegistry(url=server.url, tls={"caFile": str(ca)}))
                written = kafka.committed(out, payloads.RegistryCodec(client, "avro").decode)
                assert written == Counter(json.dumps({"key": "a", "value": n}) for n in range(5))
            else:
                model["jobId"] = "untrusted"
                err = _refused(home.parent / "bad-home", model, kafka, out)
                assert f"kafka sink 'out': schema registry at {server.url} cannot be used: " in err
                assert "CERTIFICATE_VERIFY_FAILED" in err, err
    finally:
        server.stop()


def test_a_registry_that_takes_only_authenticated_calls_is_used_as_username(
    tmp_path, kafka, secured_registry
):
    """Apicurio requiring Hydra's tokens, given HTTP basic credentials (an OAuth client's id and
    secret, as Confluent clients send them): a sink as `username`, the password in
    NOPSTREAM_REGISTRY_PASSWORD, registers its schema and writes exactly; with a wrong password or
    none, the job is refused at start in one line, nothing published; the password is in no file the
    job wrote and in no output."""
    from nopstream.connectors.schema_registry import PASSWORD_ENV

    user, password = REGISTRY_CLIENT
    url = secured_registry.url
    for case, given in (("good", password), ("wrong", f"not-{password}"), ("none", None)):
        out = kafka.create("out")
        model = _sink_model(kafka, Registry(url), out, {"valueSchema": json.dumps(jobs.TOTAL)})
        model["jobId"] = f"registry-user-{case}"
        model["model"]["sinks"][0]["config"]["schemaRegistry"]["username"] = user
        env = {PASSWORD_ENV: given} if given is not None else {}
        home = tmp_path / case
        if case == "good":
            result = run(home / "job", model, env)
            assert result.returncode == 0, result.stderr
            written = [p.read_bytes() for p in home.rglob("*") if p.is_file()]
            assert not [b for b in written if password.encode() in b] and password not in result.stderr
            os.environ[PASSWORD_ENV] = password  # the test's own reader, as the job's
            try:
                client = SchemaRegistryClient(SchemaRegistry(url=url, username=user))
                codec = payloads.RegistryCodec(client, "avro")
                assert kafka.committed(out, codec.decode) == Counter(
                    json.dumps({"key": "a", "value": n}) for n in range(5)
                )
            finally:
                del os.environ[PASSWORD_ENV]
            continue
        err = _refused(home, model, kafka, out, env)
        refusal = (
            f"kafka sink 'out': schema registry at {url}"
            + {
                "wrong": f" refused user '{user}': HTTP 401",
                "none": f": user '{user}' has no password ({PASSWORD_ENV})",
            }[case]
        )
        assert refusal in err, err
        assert len([line for line in err.splitlines() if "kafka sink 'out'" in line]) == 1
        assert password not in err


def test_a_registry_url_with_a_user_in_it_is_refused_by_validation(tmp_path, nopstream):
    """A password never goes into the model: a registry URL that names a user is refused, unechoed."""
    registry = {"url": "https://app:hunter2@registry.example:8081/apis/ccompat/v7"}
    sink = {"bootstrapServers": "127.0.0.1:1", "topic": "u", "format": "avro", "subject": "s"}
    job = {
        "jobId": "user-in-url",
        "model": {
            "sources": [
                {"id": "in", "type": "kafka", "config": {"bootstrapServers": "127.0.0.1:1", "topic": "t"}}
            ],
            "operators": [],
            "sinks": [{"id": "out", "type": "kafka", "config": {**sink, "schemaRegistry": registry}}],
        },
    }
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    result = nopstream("validate", str(tmp_path / "job.yaml"))
    assert result.code == 1 and "hunter2" not in result.out + result.err
    assert (
        "model.sinks[0].config.schemaRegistry: Value error, url names a user: give it as username, its"
        " password in the connector's Secret (key registry-password) or NOPSTREAM_REGISTRY_PASSWORD,"
        " never in the model"
    ) in result.err


def test_avro_values_are_read_as_what_json_holds():
    """Bytes as base64 text, decimals and UUIDs as text, dates and times as the numbers they are
    encoded as (an event-time field wants them so), unions as their branch's value."""
    schema = {
        "type": "record",
        "name": "Row",
        "fields": [
            {"name": "raw", "type": "bytes"},
            {
                "name": "price",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 2},
            },
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "maybe", "type": ["null", "double"]},
        ],
    }
    at = datetime.datetime(2026, 12, 5, 10, 0, tzinfo=datetime.UTC)
    row = {
        "raw": b"\x00\xff",
        "price": decimal.Decimal("12.34"),
        "id": uuid.UUID(int=7),
        "at": at,
        "day": datetime.date(2026, 12, 5),
        "maybe": 1.5,
    }
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), row)
    assert payloads.AvroSchema(json.dumps(schema)).read(buffer.getvalue()) == {
        "raw": "AP8=",
        "price": "12.34",
        "id": str(uuid.UUID(int=7)),
        "at": int(at.timestamp() * 1000),
        "day": (datetime.date(2026, 12, 5) - datetime.date(1970, 1, 1)).days,
        "maybe": 1.5,
    }


def test_avro_values_read_as_what_json_holds_are_written_back_to_the_same_bytes():
    """What a source read (bytes and fixed as base64 text, decimals and UUIDs as text) is what a sink
    writes: the same bytes, through unions, arrays, maps and named types; a value that is not base64
    or not a number is refused by the schema, as a bad record."""
    money = {
        "type": "fixed",
        "name": "Money",
        "size": 4,
        "logicalType": "decimal",
        "precision": 8,
        "scale": 2,
    }
    schema = {
        "type": "record",
        "name": "Row",
        "namespace": "shop",
        "fields": [
            {"name": "raw", "type": "bytes"},
            {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 2}},
            {
                "name": "price",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 2},
            },
            {"name": "cost", "type": money},
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "maybe", "type": ["null", "shop.Digest"]},
            {"name": "chunks", "type": {"type": "array", "items": "bytes"}},
            {"name": "prices", "type": {"type": "map", "values": "shop.Money"}},
            {
                "name": "part",
                "type": [
                    "null",
                    {"type": "record", "name": "A", "fields": [{"name": "a", "type": "bytes"}]},
                    {"type": "record", "name": "B", "fields": [{"name": "b", "type": "string"}]},
                ],
            },
            {"name": "label", "type": ["string", "bytes"]},
        ],
    }
    row = {
        "raw": b"\x00\xff",
        "digest": b"\x01\x02",
        "price": decimal.Decimal("12.34"),
        "cost": decimal.Decimal("-0.05"),
        "id": uuid.UUID(int=7),
        "maybe": b"\x03\x04",
        "chunks": [b"", b"\x05"],
        "prices": {"x": decimal.Decimal("1.00")},
        "part": {"b": "text"},
        "label": "plain",
    }
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), row)
    avro = payloads.AvroSchema(json.dumps(schema))
    read = avro.read(buffer.getvalue())
    assert read["maybe"] == base64.b64encode(b"\x03\x04").decode() and read["cost"] == "-0.05"
    assert avro.write(read) == buffer.getvalue()
    assert avro.write({**read, "part": {"a": "AAE="}}) != buffer.getvalue()  # the record A, its bytes
    with pytest.raises(payloads.PayloadError, match="does not fit the Avro schema"):
        avro.write({**read, "raw": "not base64!"})
    with pytest.raises(payloads.PayloadError, match="does not fit the Avro schema"):
        avro.write({**read, "price": "twelve"})


def test_subtasks_registering_a_new_subject_at_once_all_get_its_id(registry):
    """A sink's subtasks register its schema at once: Apicurio may answer a first registration of a
    subject racing another with 409 "already exists" (a CI dry run's job was refused so); the client
    asks again and every one gets the same id."""
    import threading

    for n in range(4):  # a schema the registry has not seen, then the same under new subjects
        subject = f"race-{random.randrange(10**9)}-value"
        schema = json.dumps(
            {**jobs.TOTAL, "name": f"Total{random.randrange(10**9)}"} if n == 0 else jobs.TOTAL
        )
        ids: list = []
        failures: list = []

        def register(
            subject: str = subject, schema: str = schema, ids: list = ids, failures: list = failures
        ) -> None:
            client = SchemaRegistryClient(SchemaRegistry(url=registry.url))
            try:
                ids.append(client.register(subject, "AVRO", schema))
            except Exception as err:
                failures.append(err)

        threads = [threading.Thread(target=register) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == [] and len(ids) == 3 and len(set(ids)) == 1
        # racing, Apicurio may keep the one schema as more than one version, all of the one id
        assert registry.latest(subject) == schema
