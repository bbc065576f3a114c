"""Keyed aggregates and reduce: a running value per key, emitted rolling or at the end.

`emit: rolling` (the default, Flink's semantics) emits `{"key", "value"}` for every
input record with the key's updated value; `emit: final` emits each key's value
once, at end of input. Accumulators are plain data, so they snapshot as they are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from operator import add, itemgetter
from typing import Any, Protocol

from nopstream.records import Batch
from nopstream.runtime.functions import resolve
from nopstream.runtime.keyed import batch_keys, hashable_keys, key_function
from nopstream.runtime.operators.base import Context, DeadLetters, KeyedOperator, empty_like


class Aggregator(Protocol):
    """create / add / merge / result over plain-data accumulators."""

    def create(self) -> Any:
        """A fresh accumulator."""
        ...

    def add(self, acc: Any, record: Any) -> Any:
        """The accumulator with one more record."""
        ...

    def merge(self, a: Any, b: Any) -> Any:
        """Two accumulators combined (session windows merge)."""
        ...

    def result(self, acc: Any) -> Any:
        """The value an accumulator stands for."""
        ...


class _Builtin:
    def __init__(self, kind: str, field: str | None) -> None:
        self.kind = kind
        self.field = field

    def value(self, record: Any) -> Any:
        return record[self.field] if self.field is not None else record

    def create(self) -> Any:
        return [0, 0] if self.kind == "avg" else (0 if self.kind in ("count", "sum") else None)

    def add(self, acc: Any, record: Any) -> Any:
        kind = self.kind
        if kind == "count":
            return acc + 1
        v = self.value(record)
        if kind == "sum":
            return acc + v
        if kind == "min":
            return v if acc is None or v < acc else acc
        if kind == "max":
            return v if acc is None or v > acc else acc
        return [acc[0] + v, acc[1] + 1]

    def merge(self, a: Any, b: Any) -> Any:
        kind = self.kind
        if kind in ("count", "sum"):
            return a + b
        if kind == "avg":
            return [a[0] + b[0], a[1] + b[1]]
        if a is None or b is None:
            return b if a is None else a
        return min(a, b) if kind == "min" else max(a, b)

    def result(self, acc: Any) -> Any:
        if self.kind == "avg":
            return acc[0] / acc[1] if acc[1] else None
        return acc


def aggregator(spec: dict[str, Any]) -> Aggregator:
    """The aggregator of an `aggregate` spec: built in, or a user object/class with the same methods."""
    if "kind" in spec:
        return _Builtin(spec["kind"], spec.get("field"))
    obj = resolve(spec["fn"])
    instance: Aggregator = obj() if isinstance(obj, type) else obj
    return instance


def is_count(agg: Aggregator) -> bool:
    """Whether an aggregator is the built-in count (whose accumulator needs no record)."""
    return isinstance(agg, _Builtin) and agg.kind == "count"


def merges_by_adding(agg: Aggregator) -> bool:
    """Whether an aggregator's accumulators merge by `+` (the built-in count and sum)."""
    return isinstance(agg, _Builtin) and agg.kind in ("count", "sum")


def output_key(key: Any) -> Any:
    """A key as written in output records (tuples back to lists)."""
    return list(key) if isinstance(key, tuple) else key


class PerKey(KeyedOperator):
    """What Aggregate and Reduce share: a key function, one value per key, rolling or final."""

    merge: Callable[[Any, Any], Any]
    """A key's value with an upstream combiner's partial value folded in (set by each kind)."""

    def __init__(self, ctx: Context) -> None:
        """Prepare the key function and the state table."""
        self.ctx = ctx
        self.key_fn = key_function(ctx.node.key)  # type: ignore[arg-type]
        self.dead = DeadLetters(ctx.node, ctx.side)
        self.final = ctx.node.spec.get("emit") == "final"
        self.table = ctx.keyed().table("acc")
        self.shard = ctx.shard_cache.shard

    def final_record(self, key: Any, value: Any) -> Any:
        """The record emitted for one key at end of input (`emit: final`)."""
        raise NotImplementedError

    def merge_partials(self, batch: Batch) -> None:
        """Fold `[key, partial]` pairs of upstream combiners (`runtime.combiner`) into the values."""
        records, table, merge = batch.records, self.table, self.merge
        keys = hashable_keys(list(map(itemgetter(0), records)))
        for k, s, (_, partial) in zip(keys, self.ctx.shard_cache.shards(keys), records, strict=True):
            d = table[s]
            d[k] = merge(d[k], partial) if k in d else partial

    def rolling(self, batch: Batch, out: list[Any], kept: list[int]) -> Batch:
        """The output of `batch`: `out`, made from its records at `kept`, with their timestamps and
        marks (nothing with `emit: final`)."""
        if self.final:
            return empty_like(batch)
        if len(kept) == len(batch.records):
            return Batch(out, batch.timestamps, batch.marks)
        picked = batch.pick(kept)
        return Batch(out, picked.timestamps, picked.marks)

    def on_end(self) -> Batch | None:
        """With `emit: final`, one record per key."""
        if not self.final:
            return None
        return Batch([self.final_record(k, v) for k, v in self.ctx.keyed().items("acc")])


class Aggregate(PerKey):
    """A running aggregate per key."""

    def __init__(self, ctx: Context) -> None:
        """Prepare the aggregator on top of the shared per-key state."""
        super().__init__(ctx)
        self.agg = aggregator(ctx.node.spec["aggregate"])
        self.count_fast = is_count(self.agg)
        # `add` is the same merge in one C call instead of two Python calls per partial
        self.merge = add if merges_by_adding(self.agg) else self.agg.merge
        self.keys_of = batch_keys(ctx.node.key)  # type: ignore[arg-type]

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Fold the batch into the per-key accumulators."""
        key_fn, table, shard = self.key_fn, self.table, self.shard
        if self.final and self.count_fast and not self.dead.on:
            # count each key of the batch once (Counter runs in C), then touch its state once
            counts = Counter(self.keys_of(batch.records))
            keys = list(counts)
            for k, s, n in zip(keys, self.ctx.shard_cache.shards(keys), counts.values(), strict=True):
                d = table[s]
                d[k] = d.get(k, 0) + n
            return empty_like(batch)
        agg, out, kept = self.agg, [], []
        for i, r in enumerate(batch.records):
            try:
                k = key_fn(r)
                d = table[shard(k)]
                acc = d[k] = agg.add(d[k] if k in d else agg.create(), r)
            except Exception as exc:
                self.dead.at(batch, i, exc)
                continue
            if not self.final:
                out.append({"key": output_key(k), "value": agg.result(acc)})
                kept.append(i)
        return self.rolling(batch, out, kept)

    def final_record(self, key: Any, value: Any) -> Any:
        """`{"key", "value"}` with the aggregate's result."""
        return {"key": output_key(key), "value": self.agg.result(value)}


class Reduce(PerKey):
    """A running reduction per key: `fn(accumulated, record)`; the value is the reduced record."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the reduce function on top of the shared per-key state."""
        super().__init__(ctx)
        self.fn = resolve(ctx.node.spec["fn"])
        self.merge = self.fn  # partially reduced values reduce like records (the fn is associative)

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Reduce the batch into the per-key values."""
        key_fn, table, shard, fn = self.key_fn, self.table, self.shard, self.fn
        out, kept = [], []
        for i, r in enumerate(batch.records):
            try:
                k = key_fn(r)
                d = table[shard(k)]
                value = d[k] = fn(d[k], r) if k in d else r
            except Exception as exc:
                self.dead.at(batch, i, exc)
                continue
            if not self.final:
                out.append(value)
                kept.append(i)
        return self.rolling(batch, out, kept)

    def final_record(self, key: Any, value: Any) -> Any:
        """The reduced record itself."""
        return value
