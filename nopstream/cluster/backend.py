"""The coordination store contract: what the etcd and the local backends both provide.

A small key-value store with revisions, leases, transactions and watches (etcd's v3
model). Every key carries the revision that created it (`create_revision`) and last
modified it (`mod_revision`); each write raises the store's revision by one. A key
bound to a lease is deleted when the lease expires or is revoked. The contract suite
(`tests/leases/test_contract.py`) runs against both backends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

log = logging.getLogger(__name__)

EMPTY: Mapping[str, bytes] = MappingProxyType({})
"""No further writes (the default of `compare_and_swap`'s `also`)."""


class StoreUnavailable(ConnectionError):
    """The store could not be reached (a network or server failure)."""


class StoreRefused(PermissionError):
    """The store refused this client: a wrong password, or a user without rights to the job's keys."""


class LeaseExpired(RuntimeError):
    """A lease is gone: its keys are deleted and its holder must stop acting."""


@dataclass(frozen=True)
class Entry:
    """A key's value and revisions."""

    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class Event:
    """A change under a watched prefix."""

    kind: str  # "put" or "delete"
    key: str
    value: bytes
    revision: int


class Backend(Protocol):
    """The store operations the cluster layer builds on."""

    async def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; its id."""
        ...

    async def refresh(self, lease: int) -> None:
        """Keep a lease alive for another TTL; LeaseExpired when it is already gone."""
        ...

    async def revoke(self, lease: int) -> None:
        """End a lease now; its keys are deleted."""
        ...

    async def get(self, key: str) -> Entry | None:
        """A key's entry, or None."""
        ...

    async def get_prefix(self, prefix: str) -> dict[str, Entry]:
        """Every key under a prefix."""
        ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write a key (bound to `lease` when given); the new revision."""
        ...

    async def delete(self, key: str) -> bool:
        """Delete a key; whether it existed."""
        ...

    async def create(self, key: str, value: bytes, *, lease: int = 0) -> int | None:
        """Write a key only if it does not exist; its create revision, or None when it existed."""
        ...

    async def compare_and_swap(
        self, key: str, expected: bytes | None, value: bytes, *, also: Mapping[str, bytes] = EMPTY
    ) -> bool:
        """Write a key (and every key of `also`, in the same transaction) only if its value is
        `expected` (None: absent); whether it did."""
        ...

    async def put_if_created_at(self, writes: dict[str, bytes], *, guard: str, create_revision: int) -> bool:
        """Write every key of `writes` atomically, only if `guard` exists with that create revision."""
        ...

    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncGenerator[Event, None]:
        """Changes under a prefix from `start_revision` (0: from now), as they happen."""
        ...

    async def revision(self) -> int:
        """The store's current revision."""
        ...

    async def close(self) -> None:
        """Release connections and background work."""
        ...


async def wait_reachable(backend: Backend, *, retry: float = 0.4) -> None:
    """Return once the store answers: a process started while it is down (or slow) waits, not dies."""
    while True:
        try:
            await backend.revision()
            return
        except StoreUnavailable as exc:
            log.info("%s; waiting for it", exc)
            await asyncio.sleep(retry)
