"""A real HTTP service to look things up in, for the async operator's tests: aiohttp on a free
loopback port, in a thread of the test process, whose latency and failures the test sets.

`GET /score?id=N` answers `{"id": N, "score": N * 7 % 100}` after `latency(N)` seconds; the
ids in `failing` answer 500 every time, those in `flaky` 500 on their first attempt only, and
those in `slow` only after 5 s. The server counts requests per id and the most in flight at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class LookupServer:
    """What the server does and what it saw."""

    latency: Callable[[int], float] = lambda n: 0.002
    failing: set[int] = field(default_factory=set)
    flaky: set[int] = field(default_factory=set)
    slow: set[int] = field(default_factory=set)
    url: str = ""
    requests: Counter[int] = field(default_factory=Counter)
    in_flight: int = 0
    most_in_flight: int = 0

    async def score(self, request: web.Request) -> web.Response:
        n = int(request.query["id"])
        self.requests[n] += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(5.0 if n in self.slow else self.latency(n))
            if n in self.failing or (n in self.flaky and self.requests[n] == 1):
                return web.json_response({"error": "unavailable"}, status=500)
            return web.json_response({"id": n, "score": n * 7 % 100})
        finally:
            self.in_flight -= 1


@contextmanager
def lookup_server(server: LookupServer) -> Iterator[LookupServer]:
    """Serve `server` on a free loopback port until the block ends; its `url` set."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/score", server.score)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(target=loop.run_forever, name="lookup-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


FNS = """\
import aiohttp

URL = {url!r}
_session = None


async def score(record):
    global _session
    if _session is None:
        _session = aiohttp.ClientSession()
    async with _session.get(URL + "/score", params={{"id": record["id"]}}) as response:
        response.raise_for_status()
        body = await response.json()
    return {{**record, "score": body["score"]}}


def no_score(record):
    return {{**record, "score": None}}


def is_server_error(exc):
    return isinstance(exc, aiohttp.ClientResponseError) and exc.status >= 500
"""
"""The user functions of a job that looks scores up on a `LookupServer` (format with `url`)."""
