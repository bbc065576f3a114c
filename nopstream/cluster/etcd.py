"""The etcd backend, through `aetcd` (the only module that imports an etcd client).

Each operation is one etcd request: conditional writes are transactions comparing
a key's create revision or value, so they are atomic on the server. Failures to
reach etcd become `StoreUnavailable`; a lease that etcd no longer knows becomes
`LeaseExpired`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Mapping
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions

from nopstream.cluster.backend import EMPTY, Entry, Event, LeaseExpired, StoreUnavailable

T = TypeVar("T")
_UNAVAILABLE = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
    ConnectionError,
    TimeoutError,
)


def _entry(kv: Any) -> Entry:
    return Entry(bytes(kv.value), int(kv.create_revision), int(kv.mod_revision), int(kv.lease))


class EtcdBackend:
    """The coordination store on a real etcd server."""

    def __init__(self, host: str, port: int, *, timeout: float = 5.0) -> None:
        """A client of the etcd server at host:port; each request times out after `timeout` seconds."""
        # gRPC backs off reconnecting for up to two minutes by default; after an etcd
        # outage the job must go on as soon as etcd is back, so keep the backoff short.
        options = {
            "grpc.initial_reconnect_backoff_ms": 100,
            "grpc.min_reconnect_backoff_ms": 100,
            "grpc.max_reconnect_backoff_ms": 1000,
        }
        self.client = aetcd.Client(host=host, port=port, timeout=timeout, options=options)

    async def _call(self, request: Awaitable[T]) -> T:
        try:
            return await request
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"etcd is unreachable: {exc}") from exc
        except aetcd.exceptions.ClientError as exc:
            if "lease not found" in str(exc):
                raise LeaseExpired(str(exc)) from exc
            raise

    async def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds."""
        lease = await self._call(self.client.lease(ttl))
        return int(lease.id)

    async def refresh(self, lease: int) -> None:
        """Keep a lease alive; LeaseExpired when etcd reports it gone (TTL 0)."""
        reply = await self._call(self.client.refresh_lease(lease))
        if reply is None or reply.TTL <= 0:
            raise LeaseExpired(f"lease {lease:x} has expired")

    async def revoke(self, lease: int) -> None:
        """End a lease now (a lease that is already gone is fine)."""
        with contextlib.suppress(LeaseExpired):
            await self._call(self.client.revoke_lease(lease))

    async def get(self, key: str) -> Entry | None:
        """A key's entry."""
        kv = await self._call(self.client.get(key.encode()))
        return None if kv is None else _entry(kv)

    async def get_prefix(self, prefix: str) -> dict[str, Entry]:
        """Every key under a prefix."""
        found = await self._call(self.client.get_prefix(prefix.encode()))
        return {bytes(kv.key).decode(): _entry(kv) for kv in found}

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write a key."""
        try:
            reply = await self._call(self.client.put(key.encode(), value, lease=lease or None))
        except aetcd.exceptions.PreconditionFailedError as exc:
            raise LeaseExpired(f"lease {lease:x} has expired") from exc
        return int(reply.header.revision)

    async def delete(self, key: str) -> bool:
        """Delete a key."""
        reply = await self._call(self.client.delete(key.encode()))
        return reply is not None and int(reply.deleted) > 0

    async def _txn(self, compare: list[Any], success: list[Any]) -> tuple[bool, list[Any]]:
        try:
            request = self.client.transaction(compare=compare, success=success, failure=[])
            ok, responses = await self._call(request)
        except aetcd.exceptions.PreconditionFailedError as exc:
            raise LeaseExpired(str(exc)) from exc
        return bool(ok), responses

    async def create(self, key: str, value: bytes, *, lease: int = 0) -> int | None:
        """Write a key only if absent; its create revision."""
        tx = self.client.transactions
        ok, responses = await self._txn(
            [tx.create(key.encode()) == 0], [tx.put(key.encode(), value, lease or None)]
        )
        return int(responses[0].response_put.header.revision) if ok else None

    async def compare_and_swap(
        self, key: str, expected: bytes | None, value: bytes, *, also: Mapping[str, bytes] = EMPTY
    ) -> bool:
        """Write a key, and `also` in the same transaction, only if its value is `expected` (None: absent)."""
        tx = self.client.transactions
        compare = tx.create(key.encode()) == 0 if expected is None else tx.value(key.encode()) == expected
        puts = [tx.put(key.encode(), value), *(tx.put(k.encode(), v) for k, v in also.items())]
        ok, _ = await self._txn([compare], puts)
        return ok

    async def put_if_created_at(self, writes: dict[str, bytes], *, guard: str, create_revision: int) -> bool:
        """Write every key of `writes` in one transaction, only if `guard` has that create revision."""
        tx = self.client.transactions
        puts = [tx.put(k.encode(), v) for k, v in writes.items()]
        ok, _ = await self._txn([tx.create(guard.encode()) == create_revision], puts)
        return ok

    async def revision(self) -> int:
        """The store's current revision."""
        found = await self._call(self.client.get_prefix(b"\0"))
        return int(found.header.revision)

    async def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncGenerator[Event, None]:
        """Changes under a prefix, as they happen."""
        watch = await self._call(
            self.client.watch_prefix(prefix.encode(), start_revision=start_revision or None)
        )
        try:
            async for ev in watch:
                kind = "put" if ev.kind == "PUT" else "delete"
                yield Event(kind, bytes(ev.kv.key).decode(), bytes(ev.kv.value), int(ev.kv.mod_revision))
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"etcd watch broke: {exc}") from exc
        finally:
            await watch.cancel()

    async def close(self) -> None:
        """Close the client."""
        await self.client.close()
