"""Built-in lookups (`type: lookup`): an async operator whose call is an HTTP GET or a PostgreSQL
query, with an optional cache of recent results.

Each record's result goes into its field `into`: the JSON body of `GET url` (`{field}`
replaced by the record's field; a 404 gives null), or the first row of `query` (its
`%(field)s` parameters from the record; no row gives null) as a mapping of column names.
Concurrency, time-outs, retries and order are the async operator's (`async_io`). With
`cache`, a subtask keeps up to `maxEntries` results, each for `ttlMs`, by the values the call
depends on (the URL, or the query's parameters), least recently used out first. Results
read from the cache are as exact as the looked-up data is fixed (docs/enrichment.md).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from nopstream.runtime.operators.async_io import AsyncMap
from nopstream.runtime.operators.base import Context


class Cache:
    """Results by key, at most `max_entries`, each for `ttl_ms`; least recently used out first."""

    def __init__(self, max_entries: int, ttl_ms: int) -> None:
        """An empty cache."""
        self.max_entries, self.ttl = max_entries, ttl_ms / 1000
        self._entries: OrderedDict[Any, tuple[float, Any]] = OrderedDict()

    def get(self, key: Any) -> tuple[bool, Any]:
        """(True, result) when `key`'s result is held and fresh, else (False, None)."""
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return False, None
        self._entries.move_to_end(key)
        return True, entry[1]

    def put(self, key: Any, result: Any) -> None:
        """Hold `key`'s result for the TTL, dropping the least recently used beyond the size."""
        self._entries[key] = (time.monotonic() + self.ttl, result)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


class Lookup(AsyncMap):
    """An async operator that looks each record's result up through its connector's client
    (`connectors.http.HttpLookup`, `connectors.postgres.PostgresLookup`)."""

    def __init__(self, ctx: Context) -> None:
        """Prepare the client and the cache."""
        spec = ctx.node.spec["lookup"]
        capacity = int((ctx.node.spec.get("async") or {}).get("capacity", 10))
        if ctx.connectors is None:
            raise RuntimeError(f"lookup '{ctx.node.node_id}' has no connectors to look up with")
        self.client = ctx.connectors.lookup(ctx.node, capacity=capacity)
        cache = spec.get("cache")
        self.cache = (
            Cache(int(cache.get("maxEntries", 10_000)), int(cache.get("ttlMs", 60_000)))
            if cache is not None
            else None
        )
        self.into: str = spec["into"]
        self.hits = self.misses = 0
        self.latency_s = 0.0  # summed over the calls made (the misses)
        super().__init__(ctx, fn=self._lookup)

    async def _lookup(self, record: Any) -> Any:
        key = self.client.key(record)
        if self.cache is not None:
            found, result = self.cache.get(key)
            if found:
                self.hits += 1
                return {**record, self.into: result}
        self.misses += 1
        started = time.monotonic()
        result = await self.client.fetch(key)
        self.latency_s += time.monotonic() - started
        if self.cache is not None:
            self.cache.put(key, result)
        return {**record, self.into: result}

    async def close(self) -> None:
        """Release the client's connections (the task ends)."""
        await self.client.close()

    def stats(self) -> dict[str, float]:
        """Cache hits, misses (the calls made), calls in flight, and the calls' summed seconds."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "in_flight": self.in_flight,
            "seconds": self.latency_s,
        }
