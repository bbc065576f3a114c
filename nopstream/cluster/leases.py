"""Keeping a lease alive, and knowing when it is lost.

A holder (task or coordinator) grants a lease and refreshes it every TTL/3. When a
refresh finds the lease gone, or refreshes have failed for a whole TTL (the store
unreachable), `lost` is set: the holder must stop acting and exit (crash-only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from nopstream.cluster.backend import Backend, LeaseExpired, StoreUnavailable

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Grants a lease and keeps it alive in the background; `async with` it."""

    def __init__(self, backend: Backend, ttl: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        """A keeper of a `ttl`-second lease on `backend`."""
        self.backend = backend
        self.ttl = ttl
        self.clock = clock
        self.lease = 0
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LeaseKeeper:
        self.lease = await self.backend.grant(self.ttl)
        self._task = asyncio.create_task(self._keep(), name=f"lease {self.lease:x}")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _keep(self) -> None:
        try:
            await self._refresh_until_lost()
        except Exception:  # a keeper that stops refreshing must not leave its holder acting
            log.exception("lease %x: its keeper failed; the lease counts as lost", self.lease)
            self.lost.set()

    async def _refresh_until_lost(self) -> None:
        last_ok = self.clock()
        while not self.lost.is_set():
            await asyncio.sleep(self.ttl / 3)
            try:
                async with asyncio.timeout(self.ttl / 3):
                    await self.backend.refresh(self.lease)
                last_ok = self.clock()
            except LeaseExpired:
                log.error("lease %x expired", self.lease)
                self.lost.set()
            except (StoreUnavailable, TimeoutError) as exc:
                if self.clock() - last_ok >= self.ttl:
                    log.error("lease %x lost: no refresh for %ss (%s)", self.lease, self.ttl, exc)
                    self.lost.set()

    async def close(self, *, revoke: bool = True) -> None:
        """Stop refreshing and (by default) revoke the lease."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if revoke and self.lease and not self.lost.is_set():
            with contextlib.suppress(StoreUnavailable, LeaseExpired, TimeoutError):
                async with asyncio.timeout(self.ttl):
                    await self.backend.revoke(self.lease)


class ThreadedLeaseKeeper:
    """A LeaseKeeper on its own thread, event loop and store client; `async with` it.

    A task's record loop runs user functions that may hold the event loop for a
    while; keep-alives must not depend on it, or a busy task would lose its lease.
    `lost` is set on the caller's loop when the lease is lost.
    """

    def __init__(self, make_backend: Callable[[], Backend], ttl: int) -> None:
        """Keep a `ttl`-second lease through a client made by `make_backend` (in the thread)."""
        self.make_backend = make_backend
        self.ttl = ttl
        self.lease = 0
        self.lost = asyncio.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    async def __aenter__(self) -> ThreadedLeaseKeeper:
        caller = asyncio.get_running_loop()
        granted: asyncio.Future[int] = caller.create_future()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._keep(caller, granted)), name="lease keeper", daemon=True
        )
        self._thread.start()
        self.lease = await granted
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the thread's loop has ended already
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    async def _keep(self, caller: asyncio.AbstractEventLoop, granted: asyncio.Future[int]) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        backend = self.make_backend()
        try:
            async with LeaseKeeper(backend, self.ttl) as keeper:
                caller.call_soon_threadsafe(granted.set_result, keeper.lease)
                stopped = asyncio.create_task(self._stop.wait())
                lost = asyncio.create_task(keeper.lost.wait())
                await asyncio.wait({stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                lost.cancel()
                if keeper.lost.is_set():
                    caller.call_soon_threadsafe(self.lost.set)
        except Exception as exc:
            if not granted.done():
                caller.call_soon_threadsafe(granted.set_exception, exc)
            else:
                caller.call_soon_threadsafe(self.lost.set)
        finally:
            await backend.close()
