"""The tests' own side of a schema registry and of its wire format, written from the Confluent
documentation apart from nopstream's client and codecs: what they write, nopstream must read."""

from __future__ import annotations

import io
import json
import urllib.request
from typing import Any

import fastavro

_JSON = {"Content-Type": "application/vnd.schemaregistry.v1+json"}


class Registry:
    """Plain HTTP calls to the registry's Confluent API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=_JSON)
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def register(
        self, subject: str, schema: dict | str, kind: str = "AVRO", references: list | None = None
    ) -> int:
        """The id of `schema` under `subject` (registered when new), importing `references` (each a
        dict of name, subject and version, as the Confluent API has them)."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        body = {"schema": text, "schemaType": kind, **({"references": references} if references else {})}
        return int(self._call("POST", f"/subjects/{subject}/versions", body)["id"])

    def references(self, subject: str) -> list:
        """The references of the subject's latest schema."""
        return list(self._call("GET", f"/subjects/{subject}/versions/latest").get("references") or [])

    def compatibility(self, subject: str, level: str) -> None:
        """Set the subject's compatibility rule (BACKWARD, FULL, NONE, ...)."""
        self._call("PUT", f"/config/{subject}", {"compatibility": level})

    def schema(self, schema_id: int) -> str:
        """The text of a schema by id."""
        return str(self._call("GET", f"/schemas/ids/{schema_id}")["schema"])

    def latest(self, subject: str) -> str:
        """The text of the subject's latest schema."""
        return str(self._call("GET", f"/subjects/{subject}/versions/latest")["schema"])

    def versions(self, subject: str) -> list[int]:
        """The subject's versions."""
        return [int(v) for v in self._call("GET", f"/subjects/{subject}/versions")]


def framed(schema_id: int, payload: bytes) -> bytes:
    """Byte 0, the schema id in 4 big-endian bytes, the payload."""
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def avro_value(schema_id: int, schema: dict, record: dict) -> bytes:
    """A record in Avro's binary encoding, framed."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return framed(schema_id, buffer.getvalue())


def avro_record(registry: Registry, value: bytes) -> dict:
    """A framed Avro value decoded with the schema its id names."""
    assert value[0] == 0, value[:8]
    schema = fastavro.parse_schema(json.loads(registry.schema(int.from_bytes(value[1:5], "big"))))
    return fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, None)
