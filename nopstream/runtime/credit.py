"""Credit-based flow control: the one place where channel credits are counted.

The receiver grants credit in batches as it consumes frames (`CreditLedger`); the
sender may have at most `window` units outstanding (`CreditWindow`) and waits when it
has no credit. Memory per channel is therefore bounded by the window plus one frame,
and backpressure propagates upstream; a task's channels share one budget
(`transport.TransportSettings.channel_window`), so its memory does not grow with its
number of inputs. Units are bytes on the http transport and
records (+1 per control frame) on the local one. The window should be several times
the grant interval, so credit is pipelined and the sender rarely stalls.
"""

from __future__ import annotations

import asyncio
import time


class CreditWindow:
    """Sender side: how many units are in flight, and waiting when the window is full."""

    def __init__(self, window: int) -> None:
        """A window of `window` units, all available."""
        self.window = window
        self.outstanding = 0
        self.max_outstanding = 0
        self._blocked = 0.0  # time spent waiting for credit: the sender's backpressure
        self._blocked_since: float | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._failure: BaseException | None = None

    async def acquire(self, units: int) -> None:
        """Wait until `units` fit in the window (one frame always fits into an empty window)."""
        while self.outstanding > 0 and self.outstanding + units > self.window:
            if self._failure is not None:
                raise self._failure
            self._room.clear()
            self._blocked_since = time.monotonic()
            try:
                await self._room.wait()
            finally:
                self._blocked += time.monotonic() - self._blocked_since
                self._blocked_since = None
        if self._failure is not None:
            raise self._failure
        self.outstanding += units
        if self.outstanding > self.max_outstanding:
            self.max_outstanding = self.outstanding

    def blocked_seconds(self) -> float:
        """Seconds spent waiting for credit so far, a wait still going on included."""
        ongoing = time.monotonic() - self._blocked_since if self._blocked_since is not None else 0.0
        return self._blocked + ongoing

    def grant(self, units: int) -> None:
        """The receiver consumed `units`: they may be sent again."""
        self.outstanding -= units
        self._room.set()

    def fail(self, failure: BaseException) -> None:
        """The channel broke: every waiting and later `acquire` raises `failure`."""
        self._failure = failure
        self._room.set()


class CreditLedger:
    """Receiver side: consumed units, returned to the sender in grants of at least `interval`."""

    def __init__(self, interval: int) -> None:
        """Grant credit back every `interval` consumed units."""
        self.interval = interval
        self._pending = 0

    def consumed(self, units: int, *, drained: bool) -> int:
        """Record consumption; the units to grant now.

        Credit goes back once the interval is reached, or as soon as the receiver has
        drained everything sent (`drained`): a sender waiting to send a frame larger
        than its remaining window must get its whole window back, or both would wait.
        """
        self._pending += units
        if self._pending < self.interval and not drained:
            return 0
        granted, self._pending = self._pending, 0
        return granted
