"""Record codecs: how a batch of JSON-compatible records becomes bytes and back.

A codec encodes a whole batch in one call (never per record). `orjson` is the
default; `json` (the standard library) is the slow, dependency-free alternative.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import orjson


class Codec(Protocol):
    """Encodes and decodes one batch (a list of JSON-compatible values)."""

    name: str

    def encode(self, records: list[Any]) -> bytes:
        """The bytes of a batch."""
        ...

    def decode(self, data: bytes) -> list[Any]:
        """The batch back from its bytes."""
        ...


class OrjsonCodec:
    """orjson: fast JSON, the default."""

    name = "orjson"

    def encode(self, records: list[Any]) -> bytes:
        """The bytes of a batch."""
        return orjson.dumps(records)

    def decode(self, data: bytes) -> list[Any]:
        """The batch back from its bytes."""
        result: list[Any] = orjson.loads(data)
        return result


class JsonCodec:
    """The standard library's json, for comparison and as a fallback."""

    name = "json"

    def encode(self, records: list[Any]) -> bytes:
        """The bytes of a batch."""
        return json.dumps(records, separators=(",", ":")).encode()

    def decode(self, data: bytes) -> list[Any]:
        """The batch back from its bytes."""
        result: list[Any] = json.loads(data)
        return result


CODECS: dict[str, Codec] = {c.name: c for c in (OrjsonCodec(), JsonCodec())}
DEFAULT_CODEC = CODECS["orjson"]
