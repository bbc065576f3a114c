"""The transport interface and the `local` backend (bounded in-process channels).

A task sends frames on `OutputChannel`s and receives them through its `InputGate`;
every send first acquires credit (`credit.CreditWindow`), so channels are bounded
the same way on both backends. `local` passes frame objects between tasks of one
process (no encoding); `http` (transport_http.py) carries encoded frames over one
websocket per channel.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from nopstream.records import Batch
from nopstream.runtime.credit import CreditLedger, CreditWindow
from nopstream.runtime.frames import Frame
from nopstream.runtime.gate import InputChannel, InputGate


@dataclass(frozen=True)
class TransportSettings:
    """How much credit a task's input channels get, in the transport's units.

    A task's channels share one `budget` (Flink's buffers per input gate): each gets an
    equal share, at most `window` and at least `floor`, so a task with 64 inputs
    buffers no more than one with 4 (unless the floor, which keeps every channel
    moving, is reached). Without a budget every channel gets `window`. Credit goes back
    every `grant_interval` units consumed, or a quarter of a smaller window.
    """

    window: int
    grant_interval: int
    budget: int | None = None
    floor: int = 1

    def channel_window(self, inputs: int) -> int:
        """The window of each channel of a task with `inputs` input channels."""
        if self.budget is None:
            return self.window
        return max(self.floor, min(self.window, self.budget // max(inputs, 1)))

    def grant_for(self, window: int) -> int:
        """The grant interval of a channel with `window` units of credit."""
        return max(1, min(self.grant_interval, window // 4))


LOCAL_SETTINGS = TransportSettings(window=16_384, grant_interval=4_096, budget=65_536, floor=1_024)  # records


def http_settings(env: Mapping[str, str] = os.environ) -> TransportSettings:
    """Bytes of credit of a task's http input channels: NOPSTREAM_CREDIT_BUDGET for all of them
    (default 4 MiB), NOPSTREAM_CREDIT_WINDOW at most per channel (default 1 MiB), at least
    64 KiB; NOPSTREAM_CREDIT_GRANT (default a quarter of the window).

    Small on purpose: a barrier waits behind what is in flight, so the window sets how
    long a checkpoint (and the first epoch after a recovery) takes under backpressure."""
    window = int(env.get("NOPSTREAM_CREDIT_WINDOW", 1 << 20))
    return TransportSettings(
        window=window,
        grant_interval=int(env.get("NOPSTREAM_CREDIT_GRANT", window // 4)),
        budget=int(env.get("NOPSTREAM_CREDIT_BUDGET", 4 << 20)),
        floor=64 << 10,
    )


HTTP_SETTINGS = http_settings()


class OutputChannel(Protocol):
    """The sending end of one channel."""

    channel_id: str
    window: CreditWindow

    async def send(self, frame: Frame) -> None:
        """Send a frame once credit allows."""
        ...

    async def close(self) -> None:
        """Release the channel (after end-of-input was sent)."""
        ...


def local_units(frame: Frame) -> int:
    """Credit units of a frame on the local transport: its records, or 1 for a control frame."""
    return len(frame.records) + 1 if isinstance(frame, Batch) else 1


class LocalOutput:
    """The sending end of a local channel: delivers frame objects straight into the receiver's gate."""

    def __init__(self, channel_id: str, gate: InputGate, target: InputChannel, window: CreditWindow) -> None:
        """Join a sender to its receiver's gate and input channel."""
        self.channel_id = channel_id
        self.window = window
        self._gate = gate
        self._target = target

    async def send(self, frame: Frame) -> None:
        """Deliver a frame once credit allows."""
        units = local_units(frame)
        await self.window.acquire(units)
        self._gate.deliver(self._target, frame, units)

    async def close(self) -> None:
        """Nothing to release."""


class LocalNetwork:
    """The channels of every task in one process."""

    def __init__(self, settings: TransportSettings = LOCAL_SETTINGS) -> None:
        """An empty network."""
        self.settings = settings
        self._inputs: dict[str, tuple[InputGate, InputChannel]] = {}

    def input(
        self, gate: InputGate, channel_id: str, *, edge_id: str, input_index: int, upstream: int
    ) -> InputChannel:
        """Register the receiving end of a channel in a task's gate (its credit comes with its sender)."""
        ch = InputChannel(channel_id, edge_id, input_index, upstream, CreditLedger(1), _unconnected)
        gate.add(ch)
        self._inputs[channel_id] = (gate, ch)
        return ch

    def output(self, channel_id: str) -> LocalOutput:
        """The sending end of a registered channel, with its share of the receiving task's budget."""
        gate, target = self._inputs[channel_id]
        window = self.settings.channel_window(len(gate.channels))  # every input is registered by now
        credit = CreditWindow(window)
        target.ledger, target.send_credit = CreditLedger(self.settings.grant_for(window)), credit.grant
        return LocalOutput(channel_id, gate, target, credit)


def _unconnected(units: int) -> None:
    raise RuntimeError("credit granted on a local channel that has no sender")
