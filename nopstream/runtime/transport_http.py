"""The `http` transport: one aiohttp server per task, one websocket per channel.

The upstream task opens a websocket to the downstream task's server and sends
HELLO (job, pipeline, run, attempt, channel). The receiver checks it against the
current run and its expected channels and answers WELCOME, or REFUSED with the
reason and closes: a channel from an older run (a fenced attempt) never delivers a
frame. Then binary frames flow in channel order; credits flow back on the same
websocket (bytes, granted by `credit.CreditLedger`). Frame bytes are made by
`frames.encode`/`decode`; nothing here knows their layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from nopstream.errors import BadInput
from nopstream.records import Batch
from nopstream.runtime.codec import DEFAULT_CODEC, Codec
from nopstream.runtime.credit import CreditLedger, CreditWindow
from nopstream.runtime.frames import (
    DATA_FRAMES,
    Credit,
    EndOfStream,
    Frame,
    Hello,
    Refused,
    Welcome,
    decode,
    encode,
)
from nopstream.runtime.gate import InputChannel, InputGate
from nopstream.runtime.transport import TransportSettings, http_settings

log = logging.getLogger(__name__)
MAX_MESSAGE = 256 << 20


class ChannelRefused(ConnectionError):
    """The downstream task refused a channel's handshake."""


class ChannelBroken(ConnectionError):
    """A channel's connection ended before its end-of-input."""


@dataclass
class Fencing:
    """What a receiver accepts: this job and pipeline, and only the current run."""

    job: str
    pipeline: str
    current_run: Callable[[], int]
    refused: int = 0
    refusals: list[str] = field(default_factory=list)

    def check(self, hello: Hello) -> str | None:
        """None when the handshake is acceptable, else the reason to refuse it."""
        if (hello.job, hello.pipeline) != (self.job, self.pipeline):
            theirs, ours = f"{hello.job}/{hello.pipeline}", f"{self.job}/{self.pipeline}"
            return f"channel {hello.channel} belongs to {theirs}, not {ours}"
        run = self.current_run()
        if hello.run != run:
            return f"stale run {hello.run} of attempt {hello.attempt}: the current run is {run}"
        return None


class HttpReceiver:
    """The receiving side of a task: its server routes and its input channels."""

    def __init__(
        self, fencing: Fencing, *, settings: TransportSettings | None = None, codec: Codec = DEFAULT_CODEC
    ) -> None:
        """Receive for one task, accepting only what `fencing` allows."""
        self.gate: InputGate | None = None
        self.fencing = fencing
        self.settings = settings or http_settings()
        self.codec = codec
        self.channels: dict[str, InputChannel] = {}
        self.connected: set[str] = set()

    def input(
        self, gate: InputGate, channel_id: str, *, edge_id: str, input_index: int, upstream: int
    ) -> InputChannel:
        """Expect a channel; its credits go back over its websocket once connected."""
        self.gate = gate
        ch = InputChannel(channel_id, edge_id, input_index, upstream, CreditLedger(1), _not_connected)
        gate.add(ch)
        self.channels[channel_id] = ch
        return ch

    def routes(self, app: web.Application) -> None:
        """Add the channel route to an application."""
        app.router.add_get("/channel", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One channel: handshake, then frames in and credits out until it closes."""
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE, autoping=True, heartbeat=None)
        await ws.prepare(request)
        first = await ws.receive()
        hello = decode(first.data, self.codec) if first.type == aiohttp.WSMsgType.BINARY else None
        if not isinstance(hello, Hello):
            await ws.close(code=aiohttp.WSCloseCode.PROTOCOL_ERROR, message=b"expected HELLO")
            return ws
        reason = self.fencing.check(hello)
        if reason is None and hello.channel not in self.channels:
            reason = f"channel {hello.channel} is not an input of this task"
        if reason is None and hello.channel in self.connected:
            reason = f"channel {hello.channel} is already connected"
        if reason is not None:
            self.fencing.refused += 1
            self.fencing.refusals.append(reason)
            log.warning("refused channel %s from attempt %s: %s", hello.channel, hello.attempt, reason)
            await ws.send_bytes(encode(Refused(reason), self.codec))
            await ws.close()
            return ws
        ch = self.channels[hello.channel]
        gate = self.gate
        assert gate is not None  # a channel is only known once input() registered it in the gate
        self.connected.add(hello.channel)
        credits: asyncio.Queue[int] = asyncio.Queue()
        ch.send_credit = credits.put_nowait
        window = self.settings.channel_window(len(self.channels))  # every input is registered by now
        ch.ledger = CreditLedger(self.settings.grant_for(window))
        await ws.send_bytes(encode(Welcome(window), self.codec))
        writer = asyncio.create_task(
            self._credit_writer(ws, credits, hello.channel), name=f"credits {hello.channel}"
        )
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                frame = decode(msg.data, self.codec)
                if not isinstance(frame, DATA_FRAMES):
                    raise ChannelBroken(f"channel {hello.channel}: unexpected {type(frame).__name__} frame")
                gate.deliver(ch, frame, len(msg.data))
                if isinstance(frame, EndOfStream):
                    break  # the channel is complete: close it from this side, while this task still runs
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await writer
        return ws

    async def _credit_writer(
        self, ws: web.WebSocketResponse, credits: asyncio.Queue[int], channel: str
    ) -> None:
        """Send granted credit back; a failure breaks the channel at once (its sender would wait forever)."""
        try:
            while True:
                units = await credits.get()
                while not credits.empty():
                    units += credits.get_nowait()
                await ws.send_bytes(encode(Credit(units), self.codec))
        except ConnectionError:
            raise  # the peer is gone: the channel ends by itself
        except Exception:
            log.exception("channel %s: its credit writer failed; closing the channel", channel)
            await ws.close(code=aiohttp.WSCloseCode.INTERNAL_ERROR, message=b"credit writer failed")
            raise


def _not_connected(units: int) -> None:
    raise ChannelBroken("credit granted on a channel that is not connected")


class HttpOutput:
    """The sending end of a channel over a websocket."""

    def __init__(
        self, channel_id: str, ws: aiohttp.ClientWebSocketResponse, window: CreditWindow, codec: Codec
    ) -> None:
        """Wrap a connected, welcomed websocket."""
        self.channel_id = channel_id
        self.window = window
        self._ws = ws
        self._codec = codec
        self._reader = asyncio.create_task(self._read_credits(), name=f"credits {channel_id}")

    @classmethod
    async def connect(
        cls,
        session: aiohttp.ClientSession,
        url: str,
        hello: Hello,
        *,
        codec: Codec = DEFAULT_CODEC,
    ) -> HttpOutput:
        """Open the websocket, shake hands, and return the channel (with the credit window the
        receiver gave it); ChannelRefused when refused."""
        ws = await session.ws_connect(
            url,
            max_msg_size=MAX_MESSAGE,
            autoping=True,
            heartbeat=None,
        )
        await ws.send_bytes(encode(hello, codec))
        reply = await ws.receive()
        answer = decode(reply.data, codec) if reply.type == aiohttp.WSMsgType.BINARY else None
        if isinstance(answer, Refused):
            await ws.close()
            raise ChannelRefused(answer.reason)
        if not isinstance(answer, Welcome):
            await ws.close()
            raise ChannelBroken(f"channel {hello.channel}: no WELCOME from {url} ({reply.type.name})")
        return cls(hello.channel, ws, CreditWindow(answer.window), codec)

    async def _read_credits(self) -> None:
        try:
            async for msg in self._ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    frame = decode(msg.data, self._codec)
                    if isinstance(frame, Credit):
                        self.window.grant(frame.units)
        finally:
            self.window.fail(ChannelBroken(f"channel {self.channel_id} closed by the receiver"))

    async def send(self, frame: Frame) -> None:
        """Send a frame once credit allows; a batch over the channel's message limit goes in halves.

        BadInput when one record alone is over the limit: it cannot cross a channel.
        """
        data = encode(frame, self._codec)
        if len(data) > MAX_MESSAGE:
            if not isinstance(frame, Batch) or len(frame.records) < 2:
                raise BadInput(
                    f"channel {self.channel_id}: a record encodes to {len(data):,} bytes, over the"
                    f" {MAX_MESSAGE:,} bytes a record may take on a channel (docs/validation.md)"
                )
            for half in _halves(frame):
                await self.send(half)
            return
        await self.window.acquire(len(data))
        await self._ws.send_bytes(data)

    async def close(self) -> None:
        """Wait until the receiver has every frame, then close.

        Call after sending end-of-input: the receiver closes the websocket once it has
        received it. Only then has everything left this process; frames still in the
        transport's buffer would be lost if the process exited earlier.
        """
        await self._reader
        await self._ws.close()


def _halves(batch: Batch) -> tuple[Batch, Batch]:
    """A batch of two records or more cut in two, in order."""
    middle = len(batch.records) // 2
    return batch.cut(0, middle), batch.cut(middle, len(batch.records))


Resolver = Callable[[str], Awaitable[str]]
"""task id -> base URL of that task's server (waits until it is known)."""


class HttpIO:
    """TaskIO over http: a receiver for inputs, websocket clients for outputs."""

    def __init__(
        self,
        receiver: HttpReceiver,
        session: aiohttp.ClientSession,
        resolve: Resolver,
        *,
        run: int,
        attempt: str,
        codec: Codec = DEFAULT_CODEC,
    ) -> None:
        """Connect outputs through `session`, finding downstream tasks with `resolve`."""
        self.receiver = receiver
        self.session = session
        self.resolve = resolve
        self.run = run
        self.attempt = attempt
        self.codec = codec

    def input(
        self, gate: InputGate, channel_id: str, *, edge_id: str, input_index: int, upstream: int
    ) -> InputChannel:
        """Expect a channel in the receiver."""
        return self.receiver.input(
            gate, channel_id, edge_id=edge_id, input_index=input_index, upstream=upstream
        )

    async def output(self, channel_id: str, downstream_task: str) -> HttpOutput:
        """Connect to the downstream task's server."""
        base = await self.resolve(downstream_task)
        hello = Hello(
            self.receiver.fencing.job, self.receiver.fencing.pipeline, self.run, self.attempt, channel_id
        )
        return await HttpOutput.connect(
            self.session,
            f"{base.replace('http', 'ws', 1)}/channel",
            hello,
            codec=self.codec,
        )
