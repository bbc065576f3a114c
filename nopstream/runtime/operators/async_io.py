"""Async operators: `async_map` and `async_flat_map` await a coroutine per record, many at once.

The records of a batch are called with at most `capacity` in flight (that many workers
take the batch's records in turn); each attempt is bounded by `timeoutMs`; a failure
`retryOn` accepts (any, without it) is tried again after `backoffMs`, doubled each time,
up to `retries` more times; a record whose attempts all timed out gets
`onTimeout(record)` when given. The batch's results leave once every record of it has
completed: in input order (`ordered`), or in the order they completed. A barrier or a
watermark comes only between batches, so no request is in flight at either: no result
overtakes one, nothing in flight needs a snapshot, and a recovery calls again what the
restored epoch had not seen (calls are at least once; results are exactly once when the
looked-up data does not change: docs/enrichment.md).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from nopstream.errors import RestoreRefused, StartRefused
from nopstream.records import Batch
from nopstream.runtime.functions import resolve
from nopstream.runtime.operators.base import Context, DeadLetters, StatelessOperator


class AsyncTimeout(TimeoutError):
    """Every attempt of a record's call ran out of time (and no `onTimeout` fallback was given)."""


class AsyncMap(StatelessOperator):
    """`await fn(record)` for each record: its result (`async_map`) or its results (`async_flat_map`)."""

    is_async = True

    def __init__(
        self, ctx: Context, *, flat: bool = False, fn: Callable[[Any], Awaitable[Any]] | None = None
    ) -> None:
        """Resolve the coroutine function (a class is instantiated: its instances are awaited), unless
        `fn` is given (a built-in lookup's), and the retry predicate and time-out fallback."""
        node = ctx.node
        if fn is None:
            target = resolve(node.spec["fn"])
            fn = target() if isinstance(target, type) else target
        self.fn: Callable[[Any], Awaitable[Any]] = fn
        if not (inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(type(self.fn).__call__)):
            raise StartRefused(
                f"operator '{node.node_id}' ({node.type}): '{node.spec['fn']}' is not a coroutine function"
                " (an `async def`, or a class whose `__call__` is one)"
            )
        a = node.spec.get("async") or {}
        self.capacity = int(a.get("capacity", 10))
        self.timeout_ms = int(a.get("timeoutMs", 10_000))
        self.retries = int(a.get("retries", 0))
        self.backoff = int(a.get("backoffMs", 100)) / 1000
        self.retry_on: Callable[[BaseException], bool] | None = (
            resolve(a["retryOn"]) if a.get("retryOn") else None
        )
        self.on_timeout: Callable[[Any], Any] | None = resolve(a["onTimeout"]) if a.get("onTimeout") else None
        self.ordered = bool(a.get("ordered", True))
        self.flat = flat
        self.dead = DeadLetters(node, ctx.side)
        self.in_flight = 0
        self.most_in_flight = 0

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Not used: the chain awaits `on_batch_async`."""
        raise RuntimeError("an async operator is awaited through on_batch_async")

    async def on_batch_async(self, batch: Batch, input_index: int) -> Batch:
        """Every record's call, at most `capacity` at once; the results in input or completion order."""
        records = batch.records
        made: list[list[Any]] = [[] for _ in records]
        completed: list[int] = []
        turns = iter(range(len(records)))

        async def worker() -> None:
            for i in turns:  # one iterator for every worker: each record is taken once
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                try:
                    result = await self._call(records[i])
                    made[i] = list(result) if self.flat else [result]
                except RestoreRefused:  # a client that cannot start (a refused login): no record's fault
                    raise
                except Exception as exc:
                    self.dead.at(batch, i, exc)  # raises it unless the operator dead-letters
                finally:
                    self.in_flight -= 1
                completed.append(i)

        try:
            async with asyncio.TaskGroup() as workers:  # a failure cancels the other calls
                for _ in range(min(self.capacity, len(records))):
                    workers.create_task(worker())
        except BaseExceptionGroup as group:  # the record's own error, as a map's would be
            first = group.exceptions[0]
            raise first from first.__cause__
        if self.ordered:
            return batch.spread(made)
        return batch.pick(completed).spread([made[i] for i in completed])

    async def _call(self, record: Any) -> Any:
        """`fn(record)` within the time-out, retried as configured."""
        attempt = 0
        while True:
            try:
                async with asyncio.timeout(self.timeout_ms / 1000):
                    return await self.fn(record)
            except RestoreRefused:  # no retry mends it
                raise
            except TimeoutError as exc:
                failure: Exception = exc
            except Exception as exc:
                failure = exc
            timed_out = isinstance(failure, TimeoutError)
            if attempt >= self.retries or (self.retry_on is not None and not self.retry_on(failure)):
                if timed_out and self.on_timeout is not None:
                    return self.on_timeout(record)
                if timed_out:
                    tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
                    raise AsyncTimeout(f"no result within {self.timeout_ms} ms ({tries})") from failure
                raise failure
            await asyncio.sleep(self.backoff * 2**attempt)
            attempt += 1


def async_flat_map(ctx: Context) -> AsyncMap:
    """An `async_flat_map`: each call's result is an iterable of records."""
    return AsyncMap(ctx, flat=True)
