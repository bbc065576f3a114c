"""The etcd backend, through `aetcd` (the only module that imports an etcd client).

Each operation is one etcd request: conditional writes are transactions comparing
a key's create revision or value, so they are atomic on the server. Failures to
reach etcd become `StoreUnavailable`; a lease that etcd no longer knows becomes
`LeaseExpired`.

An etcd that speaks TLS or checks who calls is reached with an `EtcdAccess`
(`cluster.etcd_access`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, Awaitable, Mapping
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.watcher
import grpc

from nopstream.cluster.backend import EMPTY, Entry, Event, LeaseExpired, StoreRefused, StoreUnavailable
from nopstream.cluster.etcd_access import EtcdAccess

T = TypeVar("T")
_REFUSED = re.compile(r"permission denied|authentication failed|user name is empty")
_UNAVAILABLE = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
    ConnectionError,
    TimeoutError,
)


def _credentials(access: EtcdAccess) -> grpc.ChannelCredentials | None:
    """The TLS credentials of a gRPC channel, or None for plain text (no CA and no certificate)."""
    if access.ca is None and access.cert is None:
        return None
    return grpc.ssl_channel_credentials(access.ca, access.key, access.cert)


class _TlsClient(aetcd.Client):  # type: ignore[misc]  # aetcd has no types
    """aetcd's client over a TLS channel: aetcd 1.0 opens plain channels only; this connects as its
    `connect` does, with `secure_channel`."""

    _is_connecting: bool  # aetcd's own (set by its __init__), typed for mypy

    def __init__(self, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        """Open the TLS channel (and authenticate) once; concurrent callers wait for the first."""
        if self._connected.is_set():
            return
        if self._is_connecting:
            async with asyncio.timeout(self._connect_wait_timeout):
                await self._connected.wait()
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = aetcd.rpc.secure_channel(target, self._credentials, options=self._options.items())
            if self._username is not None:
                self.auth_stub = aetcd.rpc.AuthStub(self.channel)
                request = aetcd.rpc.AuthenticateRequest(name=self._username, password=self._password)
                try:
                    reply = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                except aetcd.rpc.AioRpcError as err:
                    aetcd.exceptions._handle_exception(err)
                self.metadata = (("token", reply.token),)
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


def _entry(kv: Any) -> Entry:
    return Entry(bytes(kv.value), int(kv.create_revision), int(kv.mod_revision), int(kv.lease))


class EtcdBackend:
    """The coordination store on a real etcd server."""

    def __init__(
        self, host: str, port: int, *, timeout: float = 5.0, access: EtcdAccess | None = None
    ) -> None:
        """A client of the etcd server at host:port (over TLS and authenticated as `access` says); each
        request times out after `timeout` seconds."""
        # gRPC backs off reconnecting for up to two minutes by default; after an etcd
        # outage the job must go on as soon as etcd is back, so keep the backoff short.
        # The "min reconnect backoff" is gRPC's shortest connect timeout, not a wait: at
        # 100 ms, TLS handshakes of processes starting side by side on a busy machine timed
        # out (69 of 500 connects at once here; none at 5 s).
        options = {
            "grpc.initial_reconnect_backoff_ms": 100,
            "grpc.min_reconnect_backoff_ms": 5000,
            "grpc.max_reconnect_backoff_ms": 1000,
        }
        access = access or EtcdAccess()
        where = {"host": host, "port": port, "timeout": timeout, "options": options}
        who = {"username": access.username, "password": access.password}
        credentials = _credentials(access)
        self.client = (
            aetcd.Client(**where, **who) if credentials is None else _TlsClient(credentials, **where, **who)
        )

    async def _call(self, request: Awaitable[T]) -> T:
        try:
            return await request
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"etcd is unreachable: {exc}") from exc
        except aetcd.exceptions.ClientError as exc:
            if "lease not found" in str(exc):
                raise LeaseExpired(str(exc)) from exc
            if _REFUSED.search(str(exc)):
                raise StoreRefused(
                    f"etcd refused this client ({exc}): the user of its certificate or username needs"
                    " read and write on the keys under /nopstream/"
                ) from None
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
