"""Blocking calls to etcd for the synchronous supervisor of `nopstream run --etcd`.

One client on one event loop, in a thread of its own, for the life of the command: gRPC's asyncio
stack is made for one event loop per process, and a new loop and channel for each call (`asyncio.run`
per call, once a second) cost a loaded machine most in the supervisor's loop. Each call is bounded:
one that does not answer within CALL_S is an outage (StoreUnavailable), waited out as any.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from nopstream.cluster.backend import StoreUnavailable
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.etcd_access import EtcdAccess

T = TypeVar("T")
CALL_S = 10.0
"""How long one call may take before it counts as etcd not answering."""


async def _client(host: str, port: int, access: EtcdAccess | None) -> EtcdBackend:
    return EtcdBackend(host, port, access=access)


class EtcdCalls:
    """Calls to the etcd server at host:port, each from this thread, each run on the client's own loop."""

    def __init__(self, etcd: str, access: EtcdAccess | None = None) -> None:
        """A client of the etcd server at `etcd` (host:port), reached as `access` says; `close` it."""
        self.where = etcd
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="etcd calls", daemon=True)
        self._thread.start()
        host, _, port = etcd.rpartition(":")
        self._backend = self._run(_client(host, int(port), access), CALL_S)

    def __call__(self, call: Callable[[EtcdBackend], Awaitable[T]], *, timeout: float = CALL_S) -> T:
        """What `call` gives on the client; StoreUnavailable when etcd cannot be reached, or does not
        answer within `timeout` seconds."""

        async def run() -> T:
            return await call(self._backend)

        return self._run(run(), timeout)

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            if future.done():  # the call's own time-out, not ours
                raise
            future.cancel()
            raise StoreUnavailable(f"etcd at {self.where} did not answer within {timeout:g} s") from None

    def close(self) -> None:
        """Close the client and end its loop's thread."""
        with contextlib.suppress(StoreUnavailable):
            self(lambda backend: backend.close(), timeout=5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()
