"""A task process's side of the wire, shared by the local runner's task processes and task pods.

One HTTP server per task carries its input channels (`runtime.transport_http`), the
coordinator's commands, its status and its metrics:
  POST /control/barrier {epoch, kind, run, token}  a source injects barrier `epoch`
  POST /control/commit  {epoch, run, token}        epochs up to `epoch` are durable
  GET  /control/status                             run, sourceFinished, the last ACK
  GET  /metrics                                    Prometheus metrics
  GET  /healthz                                    200 while the process serves
Every route but the last two needs the job's secret (`node.wire.guard`: 401) and, when
the job speaks TLS, the job's certificate (403). A command
without its run and token is refused with 400, one of another run, or with a fencing
token lower than the highest this task has seen, with 409 (both counted in the
fenced-attempts metric): a deposed coordinator can no longer make a task act.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from nopstream.cluster.fencing import TokenGate
from nopstream.node.wire.guard import Guard, GuardCollector, healthz, json_body
from nopstream.node.wire.messages import Command, TaskStatus
from nopstream.node.wire.tls import JobTls, scheme, server_context
from nopstream.runtime.metrics import TaskCollector, exposition
from nopstream.runtime.task import Task
from nopstream.runtime.transport_http import HttpReceiver


class Reporting(Protocol):
    """What a task reported to its coordinator (`tasklife.ReportingListener`)."""

    def status(self, run: int) -> TaskStatus:
        """Its status in run `run`: whether its source finished, its last ACK."""


class TaskServer:
    """Serves one task's channels, commands, status and metrics on one port."""

    def __init__(
        self,
        task: Task,
        receiver: HttpReceiver,
        listener: Reporting | None,
        *,
        run: int,
        guard: Guard,
    ) -> None:
        """Serve `task` of run `run` to clients that `guard` admits."""
        self.task = task
        self.listener = listener
        self.run = run
        self.gate = TokenGate()
        self.app = guard.application()
        receiver.routes(self.app)
        self.app.router.add_post("/control/barrier", self._barrier)
        self.app.router.add_post("/control/commit", self._commit)
        self.app.router.add_get("/control/status", self._status)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", healthz)
        self.registry = CollectorRegistry()
        self.registry.register(
            TaskCollector(lambda: [task], semantic_mode=task.plan.identity.semantic_mode.value)
        )
        self.registry.register(GuardCollector(guard))
        self._runner: web.AppRunner | None = None

    async def start(
        self, host: str, port: int, *, advertise: str | None = None, tls: JobTls | None = None
    ) -> str:
        """Listen on host:port (0: any free port), over TLS with `tls`; the endpoint others reach it at."""
        # A task that stops (it cannot start, or fails) does not wait for the channels upstream
        # tasks still hold open to it: aiohttp would give open handlers a minute.
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=server_context(tls))
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"{scheme(tls)}://{advertise or host}:{bound}"

    async def close(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _admitted(self, request: web.Request, command: str) -> Command:
        try:
            body = await json_body(request, "run", "token", "epoch")
            given = Command.from_json(body)
        except web.HTTPBadRequest:
            self.task.metrics.refused_commands += 1
            raise
        except ValueError as err:
            self.task.metrics.refused_commands += 1
            raise web.HTTPBadRequest(text=str(err)) from None
        run, token = given.run, given.token
        if run != self.run:
            self.task.metrics.refused_commands += 1
            raise web.HTTPConflict(text=f"{command} of run {run} refused: this task is in run {self.run}")
        if not self.gate.admit(token, command):
            self.task.metrics.refused_commands += 1
            raise web.HTTPConflict(
                text=f"{command} refused: token {token} < {self.gate.highest} (a deposed coordinator)"
            )
        return given

    async def _barrier(self, request: web.Request) -> web.Response:
        command = await self._admitted(request, "barrier")
        try:
            kind = command.epoch_kind()
        except ValueError as err:
            raise web.HTTPBadRequest(text=str(err)) from None
        injected = self.task.trigger_barrier(command.epoch, kind)
        return web.json_response({"ok": True, "injected": injected})

    async def _commit(self, request: web.Request) -> web.Response:
        command = await self._admitted(request, "commit")
        await self.task.commit(command.epoch)
        return web.json_response({"ok": True})

    async def _status(self, request: web.Request) -> web.Response:
        status = self.listener.status(self.run) if self.listener is not None else TaskStatus(self.run)
        return web.json_response(status.to_json())

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=exposition(self.registry), content_type="text/plain")
