"""Avro values as records cross channels (what JSON holds) and back: bytes and fixed as base64 text,
decimals and UUIDs as text, date and time logical types as the numbers they are encoded as."""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any
from uuid import UUID

_TIME_TYPES = {"date", "time-millis", "time-micros", "timestamp-millis", "timestamp-micros",
               "local-timestamp-millis", "local-timestamp-micros"}  # fmt: skip


def without_time_types(schema: Any) -> Any:
    """The schema with its date and time logical types dropped (their values stay numbers)."""
    if isinstance(schema, list):
        return [without_time_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        k: without_time_types(v) for k, v in schema.items() if not (k == "logicalType" and v in _TIME_TYPES)
    }


def json_ready(value: Any) -> Any:
    """A decoded value with bytes as base64 text, decimals and UUIDs as text."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal | UUID):
        return str(value)
    return value


def avro_ready(schema: Any, value: Any, named: dict[str, Any]) -> Any:
    """`json_ready` undone where `schema` wants it: base64 text as bytes (bytes, fixed), decimal text
    as a Decimal; a value that is neither is left for fastavro to refuse."""
    if isinstance(schema, str):
        if schema in named:
            return avro_ready(named[schema], value, named)
        return _bytes(value) if schema == "bytes" else value
    if isinstance(schema, list):
        return avro_ready(_branch(schema, value, named), value, named)
    kind = schema["type"]
    if kind in ("record", "error") and isinstance(value, dict):
        fields = {f["name"]: f["type"] for f in schema["fields"]}
        return {k: avro_ready(fields[k], v, named) if k in fields else v for k, v in value.items()}
    if kind == "array" and isinstance(value, list):
        return [avro_ready(schema["items"], v, named) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: avro_ready(schema["values"], v, named) for k, v in value.items()}
    if schema.get("logicalType") == "decimal" and isinstance(value, str | int | float):
        try:
            return Decimal(str(value))
        except ArithmeticError:  # decimal.InvalidOperation: not a number
            return value
    if kind == "fixed":
        return _bytes(value)
    return avro_ready(kind, value, named)  # {"type": "bytes"}, or a type nested as {"type": {...}}


def _bytes(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        return value


_JSON_KINDS: dict[type, tuple[str, ...]] = {
    bool: ("boolean",),
    int: ("int", "long", "float", "double", "bytes", "fixed"),  # a whole decimal reads as text, though
    float: ("float", "double", "bytes", "fixed"),
    str: ("string", "enum", "bytes", "fixed"),
    list: ("array",),
    dict: ("record", "error", "map"),
}


def _branch(union: list[Any], value: Any, named: dict[str, Any]) -> Any:
    """The branch of a union a value written from JSON takes: null for None, else the first whose kind
    holds the value's JSON type (a record's only when it has every field the value names)."""
    if value is None:
        return "null"
    for branch in union:
        resolved = named.get(branch, branch) if isinstance(branch, str) else branch
        kind = resolved if isinstance(resolved, str) else resolved["type"]
        if kind not in _JSON_KINDS.get(type(value), ()):
            continue
        if kind in ("record", "error") and not set(value) <= {f["name"] for f in resolved["fields"]}:
            continue
        return branch
    return union[0]
