"""Stateless operators: map, filter, flat_map, and the pass-through key_by and union."""

from __future__ import annotations

from itertools import chain
from typing import Any

from nopstream.records import Batch
from nopstream.runtime.functions import resolve
from nopstream.runtime.operators.base import Context, StatelessOperator


class Map(StatelessOperator):
    """One record out per record in: `fn(record)`."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the user function."""
        self.fn = resolve(ctx.node.spec["fn"])

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Apply `fn` to every record; timestamps are kept."""
        fn = self.fn
        return Batch([fn(r) for r in batch.records], batch.timestamps)


class Filter(StatelessOperator):
    """Records for which `fn(record)` is true."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the user function."""
        self.fn = resolve(ctx.node.spec["fn"])

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Keep the records (and their timestamps) that pass."""
        fn = self.fn
        if batch.timestamps is None:
            return Batch([r for r in batch.records if fn(r)])
        kept = [(r, t) for r, t in zip(batch.records, batch.timestamps, strict=True) if fn(r)]
        return Batch([r for r, _ in kept], [t for _, t in kept])


class FlatMap(StatelessOperator):
    """Zero or more records out per record in: `fn(record)` returns an iterable."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the user function."""
        self.fn = resolve(ctx.node.spec["fn"])

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Concatenate `fn(record)` for every record; each output keeps its input's timestamp."""
        fn = self.fn
        if batch.timestamps is None:
            return Batch(list(chain.from_iterable(map(fn, batch.records))))
        out: list[Any] = []
        stamps: list[int] = []
        for r, t in zip(batch.records, batch.timestamps, strict=True):
            produced = list(fn(r))
            out.extend(produced)
            stamps.extend([t] * len(produced))
        return Batch(out, stamps)


class PassThrough(StatelessOperator):
    """key_by and union: records pass unchanged (partitioning happens on the edges)."""

    def __init__(self, ctx: Context) -> None:
        """Nothing to prepare."""

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """The batch itself."""
        return batch
