"""The in-process backend: etcd's semantics in one process, for `nopstream run`.

Revisions, create/mod revisions, leases with TTLs on an injectable clock, atomic
compare-and-set operations and prefix watches, all in memory and behind one lock.
Leases expire when `expire_leases()` runs (a background sweeper calls it, or a test
does, with its own clock).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator, Callable, Mapping

from nopstream.cluster.backend import EMPTY, Entry, Event, LeaseExpired


class LocalBackend:
    """An in-memory coordination store with etcd's contract."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """An empty store; lease expiry is measured with `clock` (seconds)."""
        self.clock = clock
        self._data: dict[str, Entry] = {}
        self._revision = 1
        self._leases: dict[int, tuple[int, float]] = {}  # id -> (ttl, deadline)
        self._ids = itertools.count(1)
        self._history: list[Event] = []
        self._watchers: list[tuple[str, asyncio.Queue[Event]]] = []
        self._sweeper: asyncio.Task[None] | None = None

    # --- leases ---------------------------------------------------------------------

    async def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds."""
        self._ensure_sweeper()
        lease = next(self._ids)
        self._leases[lease] = (ttl, self.clock() + ttl)
        return lease

    async def refresh(self, lease: int) -> None:
        """Keep a lease alive for another TTL."""
        self.expire_leases()
        if lease not in self._leases:
            raise LeaseExpired(f"lease {lease} has expired")
        ttl, _ = self._leases[lease]
        self._leases[lease] = (ttl, self.clock() + ttl)

    async def revoke(self, lease: int) -> None:
        """End a lease and delete its keys."""
        self._drop_lease(lease)

    def expire_leases(self) -> None:
        """Drop every lease past its deadline (and its keys)."""
        now = self.clock()
        for lease, (_, deadline) in list(self._leases.items()):
            if deadline <= now:
                self._drop_lease(lease)

    def _drop_lease(self, lease: int) -> None:
        self._leases.pop(lease, None)
        for key, entry in list(self._data.items()):
            if entry.lease == lease:
                self._delete(key)

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="local-lease-sweeper")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            self.expire_leases()

    # --- keys -------------------------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        """A key's entry."""
        self.expire_leases()
        return self._data.get(key)

    async def get_prefix(self, prefix: str) -> dict[str, Entry]:
        """Every key under a prefix, sorted."""
        self.expire_leases()
        return {k: v for k, v in sorted(self._data.items()) if k.startswith(prefix)}

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write a key."""
        self.expire_leases()
        if lease and lease not in self._leases:
            raise LeaseExpired(f"lease {lease} has expired")
        return self._put(key, value, lease)

    async def delete(self, key: str) -> bool:
        """Delete a key."""
        self.expire_leases()
        return self._delete(key)

    async def create(self, key: str, value: bytes, *, lease: int = 0) -> int | None:
        """Write a key only if absent."""
        self.expire_leases()
        if key in self._data:
            return None
        if lease and lease not in self._leases:
            raise LeaseExpired(f"lease {lease} has expired")
        return self._put(key, value, lease)

    async def compare_and_swap(
        self, key: str, expected: bytes | None, value: bytes, *, also: Mapping[str, bytes] = EMPTY
    ) -> bool:
        """Write a key, and `also` with it, only if its value is `expected`."""
        self.expire_leases()
        current = self._data.get(key)
        if (current.value if current else None) != expected:
            return False
        for k, v in {key: value, **also}.items():
            self._put(k, v, 0)
        return True

    async def put_if_created_at(self, writes: dict[str, bytes], *, guard: str, create_revision: int) -> bool:
        """Write every key of `writes`, only if `guard` exists with that create revision."""
        self.expire_leases()
        g = self._data.get(guard)
        if g is None or g.create_revision != create_revision:
            return False
        for key, value in writes.items():
            self._put(key, value, 0)
        return True

    async def revision(self) -> int:
        """The current revision."""
        return self._revision

    def _put(self, key: str, value: bytes, lease: int) -> int:
        self._revision += 1
        old = self._data.get(key)
        created = old.create_revision if old else self._revision
        self._data[key] = Entry(value, created, self._revision, lease)
        self._notify(Event("put", key, value, self._revision))
        return self._revision

    def _delete(self, key: str) -> bool:
        if key not in self._data:
            return False
        del self._data[key]
        self._revision += 1
        self._notify(Event("delete", key, b"", self._revision))
        return True

    def _notify(self, event: Event) -> None:
        self._history.append(event)
        for prefix, queue in self._watchers:
            if event.key.startswith(prefix):
                queue.put_nowait(event)

    async def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncGenerator[Event, None]:
        """Changes under a prefix (replaying history from `start_revision`)."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        if start_revision:
            for event in self._history:
                if event.revision >= start_revision and event.key.startswith(prefix):
                    queue.put_nowait(event)
        entry = (prefix, queue)
        self._watchers.append(entry)
        try:
            while True:
                yield await queue.get()
        finally:
            self._watchers.remove(entry)

    async def close(self) -> None:
        """Stop the lease sweeper."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
