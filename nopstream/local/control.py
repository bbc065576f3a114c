"""The local runner's control server: where task processes register, report and find each other.

JSON over HTTP on loopback:
  POST /register {taskId, run, attempt, endpoint}    a task's server is up
  GET  /endpoint?task=ID                              that task's endpoint (waits until known)
  POST /stats {taskId, run, recordsIn, recordsOut, watermark}
  POST /done {taskId, run}  |  POST /failed {taskId, run, error, refused}   (refused: it cannot
  start at all, "restore" when its restore point is refused, "start" when a connector cannot start)
  GET  /run                                           the current run
  POST /ack {taskId, run, epoch, segments, sources, sinks} a task's checkpoint ACK
  POST /source-finished {taskId, run}                 a source read all its input
  GET  /metrics                                       the coordinator's Prometheus metrics
  POST /savepoint                                     make the next epoch a savepoint
Everything but /metrics needs the run's secret (`node.guard`: 401); a task's message
without its task id and run is refused with 400, one of another run with 409.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from nopstream.checkpoint.coordinator import EpochCoordinator
from nopstream.checkpoint.metrics import CoordinatorCollector
from nopstream.node.guard import Guard, GuardCollector, int_field, json_body
from nopstream.node.taskserver import ack_of
from nopstream.runtime.metrics import exposition


@dataclass
class TaskReport:
    """What the runner knows of one task."""

    endpoint: str | None = None
    attempt: str | None = None
    records_in: int = 0
    records_out: int = 0
    watermark: int | None = None
    channels: dict[str, dict[str, int]] = field(default_factory=dict)
    done: bool = False
    error: str | None = None
    refused: str | None = None
    registered_at: float | None = None
    done_at: float | None = None
    registered: asyncio.Event = field(default_factory=asyncio.Event)


class ControlServer:
    """Registry and reports of the task processes of one run."""

    def __init__(self, task_ids: list[str], *, run: int, guard: Guard) -> None:
        """Expect these tasks, in run `run`, admitting the clients `guard` admits."""
        self.run = run
        self.guard = guard
        self.tasks = {t: TaskReport() for t in task_ids}
        self.changed = asyncio.Event()
        self.coordinator: EpochCoordinator | None = None
        self.recoveries = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, sock: socket.socket) -> str:
        """Serve on a listening loopback socket; returns the base URL."""
        app = self.guard.application()
        app.router.add_post("/register", self._register)
        app.router.add_get("/endpoint", self._endpoint)
        app.router.add_post("/stats", self._stats)
        app.router.add_post("/done", self._done)
        app.router.add_post("/failed", self._failed)
        app.router.add_get("/run", self._run)
        app.router.add_post("/ack", self._ack)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/savepoint", self._savepoint)
        app.router.add_post("/source-finished", self._source_finished)
        # A run that ends or fails does not wait for requests still waiting on a task
        # that will never register (GET /endpoint waits up to a minute).
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()

    def _task(self, task_id: object) -> TaskReport:
        task = self.tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            raise web.HTTPNotFound(text=f"unknown task {task_id!r}")
        return task

    async def _message(self, request: web.Request, *required: str) -> tuple[TaskReport, dict[str, Any]]:
        """The reporting task and the body of a message of a task of this run (400, 404, 409 otherwise)."""
        body = await json_body(request, "taskId", "run", *required)
        run = int_field(body, "run")
        if run != self.run:
            raise web.HTTPConflict(text=f"stale run {run}: the current run is {self.run}")
        return self._task(body["taskId"]), body

    async def _register(self, request: web.Request) -> web.Response:
        task, body = await self._message(request, "endpoint", "attempt")
        task.endpoint, task.attempt = str(body["endpoint"]), str(body["attempt"])
        task.registered_at = time.monotonic()
        task.registered.set()
        return web.json_response({"ok": True})

    async def _endpoint(self, request: web.Request) -> web.Response:
        task = self._task(request.query.get("task", ""))
        try:
            await asyncio.wait_for(task.registered.wait(), 60)
        except TimeoutError:
            raise web.HTTPGatewayTimeout(text=f"task {request.query['task']} did not register") from None
        return web.json_response({"endpoint": task.endpoint})

    async def _stats(self, request: web.Request) -> web.Response:
        task, body = await self._message(request, "recordsIn", "recordsOut")
        task.records_in, task.records_out = int_field(body, "recordsIn"), int_field(body, "recordsOut")
        task.watermark = body.get("watermark")
        task.channels = body.get("channels", {})
        return web.json_response({"ok": True})

    async def _done(self, request: web.Request) -> web.Response:
        report, _ = await self._message(request)
        report.done, report.done_at = True, time.monotonic()
        self.changed.set()
        return web.json_response({"ok": True})

    async def _failed(self, request: web.Request) -> web.Response:
        report, body = await self._message(request)
        report.error = str(body.get("error", "unknown error"))
        report.refused = str(body["refused"]) if body.get("refused") else None
        self.changed.set()
        return web.json_response({"ok": True})

    def processing_seconds(self) -> float:
        """From the last task's registration to the last task's end (0 when unknown)."""
        starts = [t.registered_at for t in self.tasks.values() if t.registered_at is not None]
        ends = [t.done_at for t in self.tasks.values() if t.done_at is not None]
        return max(ends) - max(starts) if starts and ends else 0.0

    async def _ack(self, request: web.Request) -> web.Response:
        _, body = await self._message(request, "epoch", "segments")
        if self.coordinator is not None:
            self.coordinator.ack(body["taskId"], int_field(body, "epoch"), ack_of(body))
        return web.json_response({"ok": True})

    async def _source_finished(self, request: web.Request) -> web.Response:
        _, body = await self._message(request)
        if self.coordinator is not None:
            self.coordinator.source_finished(body["taskId"])
        return web.json_response({"ok": True})

    async def _savepoint(self, request: web.Request) -> web.Response:
        if self.coordinator is None:
            raise web.HTTPServiceUnavailable(text="no coordinator yet")
        self.coordinator.request_savepoint()
        return web.json_response({"requested": True, "savepoints": self.coordinator.savepoints})

    async def _metrics(self, request: web.Request) -> web.Response:
        registry = CollectorRegistry()
        if self.coordinator is not None:
            registry.register(CoordinatorCollector(self.coordinator, recoveries=self.recoveries))
        registry.register(GuardCollector(self.guard))
        return web.Response(body=exposition(registry), content_type="text/plain")

    async def _run(self, request: web.Request) -> web.Response:
        return web.json_response({"run": self.run})
