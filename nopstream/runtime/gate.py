"""The input gate: every input channel of a task, and which of them may be read now.

Transports append received frames to a channel's buffer; the task takes them with
`InputGate.next()`, round-robin over channels that have data and are not blocked.
Alignment blocks a channel after its barrier: its later frames stay in its buffer,
no credit is granted for them, and the sender stalls once its window is full.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nopstream.runtime.credit import CreditLedger
from nopstream.runtime.frames import Frame


@dataclass
class InputChannel:
    """One input channel: identity, position in the task's inputs, buffered frames."""

    channel_id: str
    edge_id: str
    input_index: int
    upstream: int
    ledger: CreditLedger
    send_credit: Callable[[int], None]
    buffer: deque[tuple[Frame, int]] = field(default_factory=deque)
    buffered_units: int = 0
    max_buffered_units: int = 0
    blocked: bool = False
    ended: bool = False  # end of data: no more records
    closed: bool = False  # end of stream: nothing more

    def consumed(self, units: int) -> None:
        """The task is done with a frame worth `units`: give credit back when due."""
        granted = self.ledger.consumed(units, drained=not self.buffer)
        if granted:
            self.send_credit(granted)


class InputGate:
    """All input channels of a task, read one frame at a time."""

    def __init__(self) -> None:
        """An empty gate; channels are added before the task runs."""
        self.channels: list[InputChannel] = []
        self._data = asyncio.Event()
        self._cursor = 0

    def add(self, channel: InputChannel) -> None:
        """Add an input channel."""
        self.channels.append(channel)

    def deliver(self, channel: InputChannel, frame: Frame, units: int) -> None:
        """A transport received `frame` (worth `units` credit) on `channel`."""
        channel.buffer.append((frame, units))
        channel.buffered_units += units
        if channel.buffered_units > channel.max_buffered_units:
            channel.max_buffered_units = channel.buffered_units
        self._data.set()

    async def next(self) -> tuple[InputChannel, Frame, int]:
        """The next frame of a readable channel, round-robin; waits when none has data."""
        while True:
            n = len(self.channels)
            for i in range(n):
                ch = self.channels[(self._cursor + i) % n]
                if ch.buffer and not ch.blocked:
                    self._cursor = (self._cursor + i + 1) % n
                    frame, units = ch.buffer.popleft()
                    ch.buffered_units -= units
                    return ch, frame, units
            self._data.clear()
            await self._data.wait()

    def block(self, channel: InputChannel) -> None:
        """Hold back `channel`'s frames (it delivered the barrier being aligned)."""
        channel.blocked = True

    def unblock_all(self) -> None:
        """Alignment is over: every channel may be read again."""
        for ch in self.channels:
            ch.blocked = False
        self._data.set()

    def open_channels(self) -> list[InputChannel]:
        """Channels that have not delivered end-of-stream (they still carry barriers)."""
        return [ch for ch in self.channels if not ch.closed]

    def open_channel_ids(self) -> set[str]:
        """The ids of `open_channels()`."""
        return {ch.channel_id for ch in self.channels if not ch.closed}

    def data_ended(self) -> bool:
        """Whether every channel has delivered end-of-data."""
        return all(ch.ended for ch in self.channels)
