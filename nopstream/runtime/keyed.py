"""Keys, shards and keyed state held per shard.

A keyed operator keeps one dict per state name and shard it owns, so a snapshot
serializes whole shards and a rescale moves shards without rewriting payloads. The
key -> shard mapping is the plan's hash policy (`plan.keys`), cached per key.
WARNING: keys must be hashable after `hashable_key` (lists become tuples); two keys
Python treats as equal share their state, and the hash policy agrees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any, cast

from nopstream.plan.keys import shard_of
from nopstream.plan.partitioned import ShardRange
from nopstream.plan.streamgraph import KeySelector
from nopstream.runtime.functions import resolve

KeyFn = Callable[[Any], Any]
_CACHE_LIMIT = 1 << 20


def hashable_key(key: Any) -> Any:
    """A key usable as a dict key: lists become tuples (recursively)."""
    if isinstance(key, list):
        return tuple(hashable_key(k) for k in key)
    return key


def hashable_keys(keys: list[Any]) -> list[Any]:
    """`hashable_key` of each key; the same list when none is a list (checked in one C pass)."""
    return [hashable_key(k) for k in keys] if list in set(map(type, keys)) else keys


def cached_all(cache: dict[Any, int], keys: list[Any], one: Callable[[Any], int]) -> list[int]:
    """`cache[k]` of each key (one C pass when all are cached), `one(k)`, which caches, for the others."""
    found = list(map(cache.get, keys))  # None where a key was not seen yet
    if None not in found:
        return cast("list[int]", found)
    return [one(k) if v is None else v for k, v in zip(keys, found, strict=True)]


def key_function(selector: KeySelector) -> KeyFn:
    """The function that takes a record's key under a selector."""
    if selector.field is not None:
        field = selector.field

        def by_field(record: Any) -> Any:
            value = record[field]
            return tuple(value) if isinstance(value, list) else value

        return by_field
    fn: KeyFn = resolve(selector.fn or "")
    return fn


def batch_keys(selector: KeySelector) -> Callable[[list[Any]], list[Any]]:
    """The function that takes the keys of a whole batch, as `key_function` takes each one's.

    A field key is read in C (`itemgetter` over the batch); only a batch holding a
    list value (keyed as a tuple) goes record by record.
    """
    if selector.field is None:
        fn = key_function(selector)
        return lambda records: list(map(fn, records))
    field, by_field = itemgetter(selector.field), key_function(selector)

    def keys(records: list[Any]) -> list[Any]:
        found = list(map(field, records))
        return [by_field(r) for r in records] if list in set(map(type, found)) else found

    return keys


class ShardCache:
    """key -> shard under the plan's hash policy, remembered for hot keys."""

    def __init__(self, shard_count: int) -> None:
        """A cache for `shard_count` shards."""
        self.shard_count = shard_count
        self.known: dict[Any, int] = {}  # key -> shard; `shards` reads it a whole batch at a time

    def shard(self, key: Any) -> int:
        """The shard of a key."""
        shard = self.known.get(key)
        if shard is None:
            if len(self.known) >= _CACHE_LIMIT:
                self.known.clear()
            shard = self.known[key] = shard_of(key, self.shard_count)
        return shard

    def shards(self, keys: list[Any]) -> list[int]:
        """The shard of each key, looked up in one pass over the cache."""
        return cached_all(self.known, keys, self.shard)


class KeyedState:
    """Named keyed state of one operator subtask: state name -> shard -> {key: value}."""

    def __init__(self, shards: ShardRange, cache: ShardCache) -> None:
        """State for the shards in `shards`."""
        self.range = shards
        self.cache = cache
        self._states: dict[str, dict[int, dict[Any, Any]]] = {}

    def table(self, name: str) -> dict[int, dict[Any, Any]]:
        """shard -> {key: value} of one state name, created empty on first use."""
        table = self._states.get(name)
        if table is None:
            table = self._states[name] = {s: {} for s in range(self.range.start, self.range.end)}
        return table

    def shard_dict(self, name: str, key: Any) -> dict[Any, Any]:
        """The {key: value} dict of the shard that holds `key`, for state `name`."""
        return self.table(name)[self.cache.shard(key)]

    def items(self, name: str) -> Iterator[tuple[Any, Any]]:
        """Every (key, value) of a state name."""
        for d in self.table(name).values():
            yield from d.items()

    def snapshot(self) -> dict[str, dict[str, list[list[Any]]]]:
        """Plain data: shard (as a string) -> state name -> [[key, value], ...]; empty shards left out."""
        out: dict[str, dict[str, list[list[Any]]]] = {}
        for name, table in self._states.items():
            for shard, d in table.items():
                if d:
                    out.setdefault(str(shard), {})[name] = _pairs(d)
        return out

    def restore(self, data: dict[str, dict[str, list[list[Any]]]]) -> None:
        """Load the shards of a snapshot that this subtask owns (others are ignored)."""
        for shard_text, states in data.items():
            shard = int(shard_text)
            if shard not in self.range:
                continue
            for name, pairs in states.items():
                table = self.table(name)
                table[shard] = {hashable_key(k): v for k, v in pairs}


def _pairs(d: dict[Any, Any]) -> list[list[Any]]:
    """`[key, value]` of each entry, tuple keys as lists (a dict without tuple keys in C)."""
    if tuple in set(map(type, d)):
        return [[list(k) if isinstance(k, tuple) else k, v] for k, v in d.items()]
    return list(map(list, d.items()))
