"""The http transport over real loopback sockets: handshake, fencing, frames in order, credit."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from nopstream.records import Batch
from nopstream.runtime.frames import Barrier, EndOfInput, EndOfStream, Hello, Watermark
from nopstream.runtime.gate import InputGate
from nopstream.runtime.transport import TransportSettings
from nopstream.runtime.transport_http import ChannelRefused, Fencing, HttpOutput, HttpReceiver


async def serve(receiver: HttpReceiver) -> tuple[web.AppRunner, str]:
    app = web.Application()
    receiver.routes(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"ws://127.0.0.1:{port}/channel"


def receiver_with_channel(
    run: int, settings: TransportSettings | None = None
) -> tuple[HttpReceiver, InputGate]:
    gate = InputGate()
    receiver = HttpReceiver(
        Fencing("job", "main", lambda: run), **({"settings": settings} if settings else {})
    )
    receiver.input(gate, "e/0/0/0", edge_id="e", input_index=0, upstream=0)
    return receiver, gate


def test_a_channel_of_a_stale_run_is_refused():
    async def scenario():
        receiver, gate = receiver_with_channel(run=2)
        runner, url = await serve(receiver)
        try:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(ChannelRefused) as refused:
                    await HttpOutput.connect(session, url, Hello("job", "main", 1, "r1-a3", "e/0/0/0"))
                assert str(refused.value) == "stale run 1 of attempt r1-a3: the current run is 2"
                with pytest.raises(ChannelRefused) as other_job:
                    await HttpOutput.connect(session, url, Hello("other", "main", 2, "r2-a0", "e/0/0/0"))
                assert str(other_job.value) == "channel e/0/0/0 belongs to other/main, not job/main"
        finally:
            await runner.cleanup()
        assert receiver.fencing.refused == 2
        assert not gate.channels[0].buffer  # nothing was delivered
        assert "e/0/0/0" not in receiver.connected

    asyncio.run(scenario())


def test_frames_arrive_in_order_and_credit_bounds_the_sender():
    async def scenario():
        settings = TransportSettings(window=20_000, grant_interval=5_000)
        receiver, gate = receiver_with_channel(run=1, settings=settings)
        runner, url = await serve(receiver)
        sent = [Batch([{"i": i, "pad": "x" * 50} for i in range(b * 100, b * 100 + 100)]) for b in range(50)]
        try:
            async with aiohttp.ClientSession() as session:
                out = await HttpOutput.connect(session, url, Hello("job", "main", 1, "r1-a0", "e/0/0/0"))
                with pytest.raises(ChannelRefused, match="already connected"):
                    await HttpOutput.connect(session, url, Hello("job", "main", 1, "r1-a9", "e/0/0/0"))

                async def send_all():
                    for batch in sent:
                        await out.send(batch)
                    await out.send(Watermark(42))
                    await out.send(Barrier(7))
                    await out.send(EndOfInput())
                    await out.send(EndOfStream())

                sender = asyncio.create_task(send_all())
                await asyncio.sleep(0.3)
                # nothing consumed yet: the sender stopped at its window
                ch = gate.channels[0]
                assert not sender.done()
                assert out.window.outstanding <= settings.window + 6_000
                assert ch.buffered_units == out.window.outstanding
                received = []
                while True:
                    _, frame, units = await gate.next()
                    received.append(frame)
                    ch.consumed(units)
                    if isinstance(frame, EndOfStream):
                        break
                await sender
                await out.close()
        finally:
            await runner.cleanup()
        assert [f.records for f in received if isinstance(f, Batch)] == [b.records for b in sent]
        assert received[-4:] == [Watermark(42), Barrier(7), EndOfInput(), EndOfStream()]
        assert out.window.max_outstanding <= settings.window + 6_000

    asyncio.run(scenario())
