"""What every HTTP endpoint and data channel of a job admits: the job's secret, then a well-formed body.

A job's processes share one secret (32 random bytes as hex): `nopstream run` makes one
per command, the operator one per StreamJob (a Secret owned by it, mounted as a file).
Every client session of a job sends it as `Authorization: Bearer <secret>`
(`headers`); every server checks it in constant time before any handler runs
(`Guard`) and answers 401 without it, counting the refusal. Only `/healthz` (which
says nothing about the job), `/metrics` (read-only counters, for scrapers) and the
dashboard's static files under `/dashboard/` (its page reads the job through
`/api/v1/job`, with the secret) are open. A guarded request whose JSON body lacks a
field a handler needs gets 400 (`json_body`); whether its run and token are current is
the handler's to say (409).

When the job speaks TLS (`node.wire.tls`: on a cluster and under `nopstream run --etcd`),
a guarded request also needs a connection that presented the job's certificate (403
otherwise), except on the routes people and their tools call (`PERSON_PATHS`: the
dashboard's API and a savepoint): the secret admits those, over TLS.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client.core import CounterMetricFamily, Metric

from nopstream import safefiles

OPEN_PATHS = frozenset({"/healthz", "/metrics", "/dashboard"})
OPEN_PREFIX = "/dashboard/"  # the dashboard's page and scripts: no job data (its script asks with the secret)
PERSON_PATHS = frozenset({"/api/v1/job", "/savepoint"})
"""Guarded routes a person's browser or CLI calls: the secret suffices, without the job's certificate."""
SECRET_BYTES = 32


class SecretError(ValueError):
    """A job secret file is missing or malformed; the message names the file."""


def new_secret() -> str:
    """A fresh job secret."""
    return secrets.token_hex(SECRET_BYTES)


def read_secret(path: Path) -> str:
    """The job secret in `path` (surrounding whitespace ignored); SecretError naming the file."""
    try:
        value = path.read_text().strip()
    except OSError as err:
        raise SecretError(f"{path}: cannot read the job secret ({err.strerror or err})") from None
    if len(value) < SECRET_BYTES:
        raise SecretError(f"{path}: the job secret must have at least {SECRET_BYTES} characters")
    if not all("!" <= c <= "~" for c in value):  # it goes into a header; an error would show it
        raise SecretError(f"{path}: the job secret must be printable ASCII without spaces")
    return value


def write_secret(path: Path, secret: str) -> None:
    """Write a job secret as a new file readable by its owner only (a name already there is removed, never
    written through); the caller's directory is private (`safefiles.private_dir`)."""
    safefiles.replace_file(path, secret.encode())


async def healthz(request: web.Request) -> web.Response:
    """`GET /healthz` of every server of a job: 200 while the process serves; it tells nothing of the job."""
    return web.json_response({"ok": True})


def headers(secret: str) -> dict[str, str]:
    """The headers a client of the job sends with every request."""
    return {"Authorization": f"Bearer {secret}"}


class Guard:
    """An aiohttp middleware admitting only requests that carry the job's secret (and, with
    `certificates`, come over a connection that presented the job's certificate)."""

    def __init__(self, secret: str, *, certificates: bool = False) -> None:
        """Admit `secret`; with `certificates`, only from the job's processes outside PERSON_PATHS."""
        self._expected = f"Bearer {secret}".encode()
        self._certificates = certificates
        self.refused = 0

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """401 (403 without the job's certificate) and counted unless the path is open or the request
        is admitted."""
        if request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIX):
            return await handler(request)
        given = request.headers.get("Authorization", "").encode(errors="replace")
        if not hmac.compare_digest(given, self._expected):
            self.refused += 1
            raise web.HTTPUnauthorized(
                text="this endpoint needs the job's secret (Authorization: Bearer ...)",
                headers={"WWW-Authenticate": 'Bearer realm="nopstream job"'},
            )
        if self._certificates and request.path not in PERSON_PATHS and not _verified_peer(request):
            self.refused += 1
            raise web.HTTPForbidden(text="this endpoint needs a TLS connection with the job's certificate")
        return await handler(request)

    def application(self) -> web.Application:
        """A new application guarded by this guard."""
        return web.Application(middlewares=[self.middleware])


def _verified_peer(request: web.Request) -> bool:
    """Whether the request's connection presented a certificate its TLS server verified (a server
    context of `node.wire.tls` verifies any that is presented, against the job's CA)."""
    transport = request.transport
    return transport is not None and bool(transport.get_extra_info("peercert"))


class GuardCollector:
    """Prometheus view of a guard: `nopstream_unauthorized_requests_total`."""

    def __init__(self, guard: Guard) -> None:
        """Expose `guard`'s refusals."""
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        """The counter of requests refused for a missing or wrong secret."""
        refused = CounterMetricFamily(
            "nopstream_unauthorized_requests",
            "Requests refused: 401 for a missing or wrong job secret, 403 without the job's certificate",
        )
        refused.add_metric([], self.guard.refused)
        yield refused


async def json_body(request: web.Request, *required: str) -> dict[str, Any]:
    """The request's JSON object; 400 naming the rule when it is not one or lacks a required field."""
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the body must be a JSON object")
    missing = [name for name in required if name not in body]
    if missing:
        raise web.HTTPBadRequest(text=f"missing field(s): {', '.join(missing)}")
    return body


def int_field(body: dict[str, Any], name: str) -> int:
    """An integer field of a body; 400 naming it otherwise."""
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise web.HTTPBadRequest(text=f"{name} must be an integer")
    return value
