"""What TLS inside a job costs a data channel, as ratios measured in one run.

One channel of the `http` transport (`runtime/transport_http.py`: a websocket, frames and
credit) on loopback, its sender and its receiver in this process's event loop, so a row's
time is the CPU both ends spend per record, as on a machine whose cores the job's tasks
share. B batches of R records (a word and a count each, as the word count's shuffle
carries) are sent and drained, then end of stream. Rows, records per second and the ratio
to the first:
  plain        ws:// (the embedded default, `nopstream run` on loopback)
  TLS          wss:// with the job's certificate on both ends (`nopstream run --etcd`
               and pods: `node/wire/tls.py`), the handshake included
Each row runs `--repeat` times, taking turns; a row's figure is its median, with its
lowest and highest ratio. Every run checks that the receiver got every record in order.
Run: `python bench/tls.py [--batches B] [--records R] [--repeat 5]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from aiohttp import web

from nopstream.node.wire.authority import issue
from nopstream.node.wire.tls import JobTls, client_session, scheme, server_context
from nopstream.records import Batch
from nopstream.runtime.frames import EndOfStream, Hello
from nopstream.runtime.gate import InputGate
from nopstream.runtime.transport_http import Fencing, HttpOutput, HttpReceiver


async def one_channel(batches: list[Batch], tls: JobTls | None) -> float:
    """Seconds to send `batches` over one channel and drain them at the other end."""
    gate = InputGate()
    receiver = HttpReceiver(Fencing("bench", "main", lambda: 1))
    receiver.input(gate, "e/0/0/0", edge_id="e", input_index=0, upstream=0)
    app = web.Application()
    receiver.routes(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(tls))
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"{scheme(tls).replace('http', 'ws')}://127.0.0.1:{port}/channel"
    count = 0
    try:
        start = time.perf_counter()
        async with client_session("unused", tls) as session:
            out = await HttpOutput.connect(session, url, Hello("bench", "main", 1, "r1-a0", "e/0/0/0"))

            async def send() -> None:
                for batch in batches:
                    await out.send(batch)
                await out.send(EndOfStream())

            sender = asyncio.create_task(send())
            while True:
                channel, frame, units = await gate.next()
                channel.consumed(units)
                if isinstance(frame, EndOfStream):
                    break
                count += len(frame.records)
            await sender
            await out.close()
        seconds = time.perf_counter() - start
    finally:
        await runner.cleanup()
    assert count == sum(len(b.records) for b in batches), f"received {count} records"
    return seconds


def main() -> None:
    """Print the rows."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=2_000)
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    batches = [
        Batch([{"key": f"word{(b * args.records + i) % 10_000}", "value": i} for i in range(args.records)])
        for b in range(args.batches)
    ]
    total = args.batches * args.records
    with tempfile.TemporaryDirectory() as tmp:
        rows: dict[str, JobTls | None] = {"plain": None, "TLS": issue("bench").write(Path(tmp))}
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.repeat):
            for name, tls in rows.items():
                times[name].append(asyncio.run(one_channel(batches, tls)))
    base = statistics.median(times["plain"])
    print(f"{total:,} records in {args.batches:,} batches over one channel, {args.repeat} turns")
    for name, seconds in times.items():
        ratios = [base / s for s in seconds]
        median = statistics.median(seconds)
        print(
            f"  {name:<6} {total / median:>12,.0f} records/s  ratio {base / median:.2f}"
            f"  (lowest {min(ratios):.2f}, highest {max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
