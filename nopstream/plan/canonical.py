"""Canonical plain data, JSON and fingerprints for the frozen dataclasses of every plan layer.

`to_plain` turns a plan dataclass into JSON-compatible data with camelCase keys;
`from_plain` rebuilds it from the type hints. The canonical JSON is sorted, compact
UTF-8, so equal plans have equal bytes and the SHA-256 fingerprint is stable across
processes and machines.
WARNING: a plan dataclass may hold only str, int, float, bool, None, enums, tuples,
plain dicts and other plan dataclasses; anything else does not round-trip.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import types
import typing
from typing import Any, TypeVar

from pydantic.alias_generators import to_camel

T = TypeVar("T")


def to_plain(obj: Any) -> Any:
    """JSON-compatible data for a plan value (dataclasses get camelCase keys)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {to_camel(f.name): to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (tuple, list)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


def from_plain(cls: type[T], data: Any) -> T:
    """Rebuild a plan dataclass of type `cls` from `to_plain` output."""
    return typing.cast(T, _build(cls, data))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(tp: Any, data: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(inner, data)
    if origin is tuple:
        (inner, _ellipsis) = typing.get_args(tp)
        return tuple(_build(inner, v) for v in data)
    if origin is typing.Literal or tp is Any or origin is dict:
        return data
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        return tp(**{f.name: _build(hints[f.name], data[to_camel(f.name)]) for f in dataclasses.fields(tp)})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    return data


def canonical_json(obj: Any) -> bytes:
    """Sorted, compact UTF-8 JSON of a plan value: equal plans give equal bytes."""
    return json.dumps(to_plain(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def fingerprint(obj: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of a plan value."""
    return "sha256:" + hashlib.sha256(canonical_json(obj)).hexdigest()
