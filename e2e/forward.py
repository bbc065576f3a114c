"""A TCP forward from a loopback port of this machine to an address inside the test namespace.

The listening socket is opened first, in this machine's network namespace; then the
process moves into the test namespace (`setns`), where every accepted connection is
relayed to the target. So the suite reaches the API server, and Services by their
cluster IP, while nothing of the cluster listens on this machine's interfaces.

Run: `python -m e2e.forward --holder PID --port P --to HOST:PORT` (PID: the namespace holder).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket

from e2e.netns import enter_net


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        if writer.can_write_eof():
            writer.write_eof()


async def _relay(target: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection(*target)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    for w in (writer, up_writer):
        w.close()


async def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    server = await asyncio.start_server(lambda r, w: _relay(target, r, w), sock=listener)
    async with server:
        await server.serve_forever()


def main() -> None:
    """Listen on 127.0.0.1:PORT here, then relay each connection to HOST:PORT inside the namespace."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--holder", type=int, required=True, help="PID of the namespace holder")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--to", required=True, help="HOST:PORT inside the namespace")
    args = parser.parse_args()
    host, _, port = args.to.rpartition(":")
    listener = socket.create_server(("127.0.0.1", args.port), reuse_port=False)
    enter_net(args.holder)
    asyncio.run(_serve(listener, (host, int(port))))


if __name__ == "__main__":
    main()
