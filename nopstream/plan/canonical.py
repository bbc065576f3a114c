"""Canonical plain data, JSON and fingerprints for the frozen dataclasses of every plan layer.

`to_plain` turns a plan dataclass into JSON-compatible data with camelCase keys;
`from_plain` rebuilds it from the type hints. The canonical JSON is sorted, compact
UTF-8, so equal plans have equal bytes and the SHA-256 fingerprint is stable across
processes and machines.
WARNING: a plan dataclass may hold only str, int, float, bool, None, enums, tuples,
plain dicts, NamedTuples and other plan dataclasses; anything else does not round-trip.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import types
import typing
import weakref
from typing import Any, TypeVar

from pydantic.alias_generators import to_camel

T = TypeVar("T")


def to_plain(obj: Any) -> Any:
    """JSON-compatible data for a plan value (dataclasses get camelCase keys).

    A NamedTuple is written as the list of its values: compact for the many small
    records of a plan (channels).
    """
    kind: Any = type(obj)
    if kind in _SCALARS:
        return obj
    if kind is tuple or kind is list:
        return [v if type(v) in _SCALARS else to_plain(v) for v in obj]
    if kind is dict:
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return [v if type(v) in _SCALARS else to_plain(v) for v in obj]
    fields = _fields(kind)
    if fields is not None:
        return {camel: to_plain(getattr(obj, name)) for name, camel in fields}
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


_SCALARS = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _fields(cls: Any) -> tuple[tuple[str, str], ...] | None:
    """(python name, JSON name) of each field of a dataclass type; None for other types."""
    if not dataclasses.is_dataclass(cls):
        return None
    return tuple((f.name, to_camel(f.name)) for f in dataclasses.fields(cls))


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
        return tp(**{name: _build(hints[name], data[camel]) for name, camel in _fields(tp) or ()})
    if isinstance(tp, type) and issubclass(tp, tuple):  # a NamedTuple, written as a list
        hints = _hints(tp)
        return tp(
            *(_build(hints[name], v) for name, v in zip(typing.cast(Any, tp)._fields, data, strict=True))
        )
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    return data


def canonical_json(obj: Any) -> bytes:
    """Sorted, compact UTF-8 JSON of a plan value: equal plans give equal bytes."""
    return plain_json(to_plain(obj))


def plain_json(plain: Any) -> bytes:
    """Sorted, compact UTF-8 JSON of data that is already plain."""
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def fingerprint(obj: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of a plan value (remembered per plan object)."""
    cached = _FINGERPRINTS.get(id(obj))
    if cached is not None and cached[0]() is obj:
        return cached[1]
    value = plain_fingerprint(to_plain(obj))
    key = id(obj)
    try:
        ref = weakref.ref(obj, lambda _ref: _FINGERPRINTS.pop(key, None))
    except TypeError:  # not weak-referenceable (a plain dict): nothing to remember it by
        return value
    _FINGERPRINTS[key] = (ref, value)
    return value


def plain_fingerprint(plain: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of plain data."""
    return "sha256:" + hashlib.sha256(plain_json(plain)).hexdigest()


# Plans are frozen, and a large one takes a while to hash: each plan object's
# fingerprint is computed once and forgotten when the object goes.
_FINGERPRINTS: dict[int, tuple[weakref.ref[Any], str]] = {}
