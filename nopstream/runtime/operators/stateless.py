"""Stateless operators: map, filter, flat_map, and the pass-through key_by and union."""

from __future__ import annotations

from itertools import chain

from nopstream.records import Batch
from nopstream.runtime.functions import resolve
from nopstream.runtime.operators.base import Context, StatelessOperator


class Map(StatelessOperator):
    """One record out per record in: `fn(record)`."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the user function."""
        self.fn = resolve(ctx.node.spec["fn"])

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Apply `fn` to every record; timestamps and marks are kept."""
        fn = self.fn
        return Batch([fn(r) for r in batch.records], batch.timestamps, batch.marks)


class Filter(StatelessOperator):
    """Records for which `fn(record)` is true."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the user function."""
        self.fn = resolve(ctx.node.spec["fn"])

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Keep the records (and their timestamps and marks) that pass."""
        fn = self.fn
        if batch.timestamps is None:
            return Batch([r for r in batch.records if fn(r)])
        return batch.pick([i for i, r in enumerate(batch.records) if fn(r)])


class FlatMap(StatelessOperator):
    """Zero or more records out per record in: `fn(record)` returns an iterable."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the user function."""
        self.fn = resolve(ctx.node.spec["fn"])

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Concatenate `fn(record)` for every record; each output keeps its input's timestamp and mark."""
        fn = self.fn
        if batch.timestamps is None:
            return Batch(list(chain.from_iterable(map(fn, batch.records))))
        return batch.spread([list(fn(r)) for r in batch.records])


class PassThrough(StatelessOperator):
    """key_by and union: records pass unchanged (partitioning happens on the edges)."""

    def __init__(self, ctx: Context) -> None:
        """Nothing to prepare."""

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """The batch itself."""
        return batch
