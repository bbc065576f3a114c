"""A task's input channels share one credit budget: its memory does not grow with its inputs.

Real websockets on loopback: N senders send as fast as credit lets them into one
receiving task that reads nothing, so every channel fills its window; what the task
then holds is its buffered bytes.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from nopstream.records import Batch
from nopstream.runtime.codec import DEFAULT_CODEC
from nopstream.runtime.frames import Hello, encode
from nopstream.runtime.gate import InputGate
from nopstream.runtime.transport import TransportSettings
from nopstream.runtime.transport_http import Fencing, HttpOutput, HttpReceiver
from tests.channels.test_http import serve

BUDGET = 2 << 20
SETTINGS = TransportSettings(window=1 << 20, grant_interval=1 << 18, budget=BUDGET, floor=16 << 10)
BATCH = Batch([{"i": i, "pad": "x" * 60} for i in range(100)])
FRAME = len(encode(BATCH, DEFAULT_CODEC))  # about 8 KB


def buffered_with(inputs: int) -> int:
    """The bytes the receiving task holds once every sender waits for credit."""

    async def scenario() -> int:
        gate = InputGate()
        receiver = HttpReceiver(Fencing("job", "main", lambda: 1), settings=SETTINGS)
        for i in range(inputs):
            receiver.input(gate, f"e/{i}/0/0", edge_id="e", input_index=0, upstream=i)
        runner, url = await serve(receiver)
        try:
            async with aiohttp.ClientSession() as session:
                outs = [
                    await HttpOutput.connect(session, url, Hello("job", "main", 1, "r1-a0", f"e/{i}/0/0"))
                    for i in range(inputs)
                ]
                assert {o.window.window for o in outs} == {SETTINGS.channel_window(inputs)}

                async def flood(out: HttpOutput) -> None:
                    while True:
                        await out.send(BATCH)

                senders = [asyncio.create_task(flood(o)) for o in outs]
                held, still = -1, 0
                while still < 5:  # no byte more for 0.5 s: every sender waits for credit
                    await asyncio.sleep(0.1)
                    now = sum(ch.buffered_units for ch in gate.channels)
                    still = still + 1 if now == held else 0
                    held = now
                for s in senders:
                    s.cancel()
                for s in senders:
                    with contextlib.suppress(asyncio.CancelledError):
                        await s
        finally:
            await runner.cleanup()
        return held

    return asyncio.run(scenario())


@pytest.mark.parametrize("inputs", [4, 64])
def test_a_task_holds_its_budget_whatever_its_number_of_inputs(inputs):
    held = buffered_with(inputs)
    # every channel fills its share of the budget up to the frame that no longer fits
    assert BUDGET - inputs * FRAME < held <= BUDGET, (held, BUDGET)


def test_without_a_budget_every_channel_gets_the_whole_window():
    assert TransportSettings(window=1 << 20, grant_interval=1 << 18).channel_window(64) == 1 << 20
    assert SETTINGS.channel_window(4) == 512 << 10
    assert SETTINGS.channel_window(64) == 32 << 10
    assert SETTINGS.channel_window(1000) == 16 << 10  # the floor: every channel keeps moving
