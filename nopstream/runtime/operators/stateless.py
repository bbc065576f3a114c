"""Stateless operators: map, filter, flat_map, and the pass-through key_by and union.

A batch goes through the user function in one comprehension; when the function fails
on a record of an operator that dead-letters, the batch is gone through again one
record at a time, the failing records set aside (`DeadLetters.guard`): the function
is called again on the records before the bad one, as a replay after a recovery does.
"""

from __future__ import annotations

from itertools import chain

from nopstream.records import Batch
from nopstream.runtime.functions import resolve
from nopstream.runtime.operators.base import Context, DeadLetters, StatelessOperator


class Map(StatelessOperator):
    """One record out per record in: `fn(record)`."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the user function."""
        self.fn = resolve(ctx.node.spec["fn"])
        self.dead = DeadLetters(ctx.node, ctx.side)

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Apply `fn` to every record; timestamps and marks are kept."""
        fn = self.fn
        return self.dead.guard(
            batch,
            lambda: Batch([fn(r) for r in batch.records], batch.timestamps, batch.marks),
            lambda r: [fn(r)],
        )


class Filter(StatelessOperator):
    """Records for which `fn(record)` is true."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the user function."""
        self.fn = resolve(ctx.node.spec["fn"])
        self.dead = DeadLetters(ctx.node, ctx.side)

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Keep the records (and their timestamps and marks) that pass."""
        fn = self.fn

        def passing() -> Batch:
            if batch.timestamps is None:
                return Batch([r for r in batch.records if fn(r)])
            return batch.pick([i for i, r in enumerate(batch.records) if fn(r)])

        return self.dead.guard(batch, passing, lambda r: [r] if fn(r) else [])


class FlatMap(StatelessOperator):
    """Zero or more records out per record in: `fn(record)` returns an iterable."""

    def __init__(self, ctx: Context) -> None:
        """Resolve the user function."""
        self.fn = resolve(ctx.node.spec["fn"])
        self.dead = DeadLetters(ctx.node, ctx.side)

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Concatenate `fn(record)` for every record; each output keeps its input's timestamp and mark."""
        fn = self.fn

        def made() -> Batch:
            if batch.timestamps is None:
                return Batch(list(chain.from_iterable(map(fn, batch.records))))
            return batch.spread([list(fn(r)) for r in batch.records])

        return self.dead.guard(batch, made, lambda r: list(fn(r)))


class PassThrough(StatelessOperator):
    """key_by and union: records pass unchanged (partitioning happens on the edges)."""

    def __init__(self, ctx: Context) -> None:
        """Nothing to prepare."""

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """The batch itself."""
        return batch
