"""The local runner's control server: where task processes register, report and find each other.

JSON over HTTP on loopback:
  POST /register {taskId, attempt, run, endpoint}    a task's server is up
  GET  /endpoint?task=ID                              that task's endpoint (waits until known)
  POST /stats {taskId, recordsIn, recordsOut, watermark}
  POST /done {taskId}  |  POST /failed {taskId, error, refused}   (refused: it cannot start at all,
  "restore" when its restore point is refused, "start" when a connector cannot start)
  GET  /run                                           the current run
  POST /ack {taskId, epoch, segments, sources, sinks} a task's checkpoint ACK
  POST /source-finished {taskId}                      a source read all its input
  GET  /metrics                                       the coordinator's Prometheus metrics
  POST /savepoint                                     make the next epoch a savepoint
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

    def __init__(self, task_ids: list[str], *, run: int) -> None:
        """Expect these tasks, in run `run`."""
        self.run = run
        self.tasks = {t: TaskReport() for t in task_ids}
        self.changed = asyncio.Event()
        self.coordinator: EpochCoordinator | None = None
        self.recoveries = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, sock: socket.socket) -> str:
        """Serve on a listening loopback socket; returns the base URL."""
        app = web.Application()
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

    def _report(self, body: dict[str, Any]) -> TaskReport:
        task = self.tasks.get(body.get("taskId", ""))
        if task is None:
            raise web.HTTPNotFound(text=f"unknown task {body.get('taskId')!r}")
        return task

    async def _register(self, request: web.Request) -> web.Response:
        body = await request.json()
        if int(body["run"]) != self.run:
            raise web.HTTPConflict(text=f"stale run {body['run']}: the current run is {self.run}")
        task = self._report(body)
        task.endpoint, task.attempt = body["endpoint"], body["attempt"]
        task.registered_at = time.monotonic()
        task.registered.set()
        return web.json_response({"ok": True})

    async def _endpoint(self, request: web.Request) -> web.Response:
        task = self._report({"taskId": request.query.get("task", "")})
        try:
            await asyncio.wait_for(task.registered.wait(), 60)
        except TimeoutError:
            raise web.HTTPGatewayTimeout(text=f"task {request.query['task']} did not register") from None
        return web.json_response({"endpoint": task.endpoint})

    async def _stats(self, request: web.Request) -> web.Response:
        body = await request.json()
        task = self._report(body)
        task.records_in, task.records_out = int(body["recordsIn"]), int(body["recordsOut"])
        task.watermark = body.get("watermark")
        task.channels = body.get("channels", {})
        return web.json_response({"ok": True})

    async def _done(self, request: web.Request) -> web.Response:
        body = await request.json()
        report = self._report(body)
        report.done, report.done_at = True, time.monotonic()
        self.changed.set()
        return web.json_response({"ok": True})

    async def _failed(self, request: web.Request) -> web.Response:
        body = await request.json()
        report = self._report(body)
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
        body = await request.json()
        self._report(body)
        if self.coordinator is not None:
            self.coordinator.ack(body["taskId"], int(body["epoch"]), ack_of(body))
        return web.json_response({"ok": True})

    async def _source_finished(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._report(body)
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
        return web.Response(body=exposition(registry), content_type="text/plain")

    async def _run(self, request: web.Request) -> web.Response:
        return web.json_response({"run": self.run})
