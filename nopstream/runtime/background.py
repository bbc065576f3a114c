"""What a task does beside its record loop: snapshot writes in order, and the first failure of any of it.

Snapshots go to the listener in the background, after their barrier went on, and
records flow while the segments are written (Flink's asynchronous snapshot): an epoch
is durable only once every task's write is, so nothing downstream depends on this one
having finished. Writes run one after another in epoch order. The first failure (a
write's, or a sink call's reported by `fail`) ends the task's loop, and no later
snapshot is written after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Background:
    """One task's background work and its first failure."""

    def __init__(self) -> None:
        """Nothing written, nothing failed."""
        self.failure: BaseException | None = None
        self._failed = asyncio.Event()
        self._last: asyncio.Future[None] | None = None  # the last write handed over, until done

    def fail(self, failure: BaseException) -> None:
        """Keep `failure` unless one came before; `unless_failed` raises it."""
        if self.failure is None:
            self.failure = failure
            self._failed.set()

    def write(self, write: Callable[[], Awaitable[None]]) -> None:
        """Run `write` once every write handed over before it is done, unless one failed; its error fails."""
        before = self._last

        async def in_turn() -> None:
            if before is not None:
                await before
            if self.failure is not None:
                return
            try:
                await write()
            except Exception as exc:
                self.fail(exc)

        self._last = asyncio.ensure_future(in_turn())

    async def written(self) -> None:
        """Return once every write handed over is done."""
        if self._last is not None:
            await self._last

    async def unless_failed(self, work: Awaitable[object]) -> None:
        """Await `work`, or raise the failure as soon as there is one (`work` cancelled)."""
        running = await run_until(work, self._failed)
        if self.failure is not None:
            raise self.failure
        running.result()


async def run_until(work: Awaitable[T], event: asyncio.Event) -> asyncio.Future[T]:
    """Run `work` until it ends or `event` is set, whichever comes first (then `work` is cancelled);
    its future, done or cancelled."""
    running, stop = asyncio.ensure_future(work), asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({running, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    return running
