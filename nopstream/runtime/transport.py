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
    """Credit window and grant interval of every channel, in the transport's units."""

    window: int
    grant_interval: int


LOCAL_SETTINGS = TransportSettings(window=16_384, grant_interval=4_096)  # records


def http_settings(env: Mapping[str, str] = os.environ) -> TransportSettings:
    """Bytes of credit per http channel: NOPSTREAM_CREDIT_WINDOW (default 4 MiB) and
    NOPSTREAM_CREDIT_GRANT (default a quarter of the window)."""
    window = int(env.get("NOPSTREAM_CREDIT_WINDOW", 4 << 20))
    return TransportSettings(
        window=window, grant_interval=int(env.get("NOPSTREAM_CREDIT_GRANT", window // 4))
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
        self._windows: dict[str, CreditWindow] = {}

    def input(
        self, gate: InputGate, channel_id: str, *, edge_id: str, input_index: int, upstream: int
    ) -> InputChannel:
        """Register the receiving end of a channel in a task's gate."""
        window = self._windows.setdefault(channel_id, CreditWindow(self.settings.window))
        ledger = CreditLedger(self.settings.grant_interval)
        ch = InputChannel(channel_id, edge_id, input_index, upstream, ledger, window.grant)
        gate.add(ch)
        self._inputs[channel_id] = (gate, ch)
        return ch

    def output(self, channel_id: str) -> LocalOutput:
        """The sending end of a registered channel."""
        gate, target = self._inputs[channel_id]
        window = self._windows.setdefault(channel_id, CreditWindow(self.settings.window))
        return LocalOutput(channel_id, gate, target, window)
