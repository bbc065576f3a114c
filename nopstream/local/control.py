"""The local runner's control server: where task processes register, report and find each other.

JSON over HTTP on loopback, beside the coordinator's own routes (`node.wire.coordinator_api`:
/ack, /source-finished, /stats, /failed, /savepoint, /api/v1/job, /dashboard/, /metrics):
  POST /register {taskId, run, attempt, endpoint}    a task's server is up
  GET  /endpoint?task=ID                              that task's endpoint (waits until known)
  POST /done {taskId, run}                            the task finished
  GET  /run                                           the current run
A task's POST /failed carries its refusal (`errors.Refusal`) when it cannot go on in any
run: its restore point or a connector refused, or it met a bad record.
Everything but /metrics and the dashboard's files needs the run's secret (`node.wire.guard`:
401); a task's message without its task id and run is refused with 400, one of another
run with 409.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from nopstream.cluster.registry import Registration
from nopstream.errors import Refusal
from nopstream.node.view.jobview import JobHistory
from nopstream.node.wire.coordinator_api import CoordinatorRoutes
from nopstream.node.wire.guard import Guard


@dataclass
class TaskReport:
    """What the runner knows of one task."""

    endpoint: str | None = None
    attempt: str | None = None
    done: bool = False
    error: str | None = None
    refusal: Refusal | None = None
    registered_at: float | None = None
    done_at: float | None = None
    registered: asyncio.Event = field(default_factory=asyncio.Event)


class ControlServer:
    """Registry and reports of the task processes of one run."""

    def __init__(self, task_ids: list[str], *, run: int, guard: Guard, history: JobHistory) -> None:
        """Expect these tasks, in run `run`, admitting the clients `guard` admits; stats go to `history`."""
        self.run = run
        self.guard = guard
        self.tasks = {t: TaskReport() for t in task_ids}
        self.changed = asyncio.Event()
        self.routes = CoordinatorRoutes(tuple(task_ids), guard, history, on_failed=self._failed)
        self.routes.lead(None, run, recoveries=run - 1)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, sock: socket.socket) -> str:
        """Serve on a listening loopback socket; returns the base URL."""
        app = self.guard.application()
        app.router.add_post("/register", self._register)
        app.router.add_get("/endpoint", self._endpoint)
        app.router.add_post("/done", self._done)
        app.router.add_get("/run", self._run)
        self.routes.add_to(app)
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

    async def endpoint(self, task_id: str) -> str:
        """Task `task_id`'s endpoint, once it has registered."""
        report = self.tasks[task_id]
        await report.registered.wait()
        assert report.endpoint is not None  # set before `registered`
        return report.endpoint

    def _task(self, task_id: object) -> TaskReport:
        task = self.tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            raise web.HTTPNotFound(text=f"unknown task {task_id!r}")
        return task

    async def _message(self, request: web.Request, *required: str) -> tuple[TaskReport, dict[str, Any]]:
        """The reporting task and the body of a message of a task of this run (400, 404, 409 otherwise)."""
        task_id, body = await self.routes.message(request, *required)
        return self.tasks[task_id], body

    async def _register(self, request: web.Request) -> web.Response:
        task, body = await self._message(request, "endpoint", "attempt")
        try:
            registration = Registration.from_json(body["taskId"], body)
        except ValueError as error:
            raise web.HTTPBadRequest(text=str(error)) from None
        task.endpoint, task.attempt = registration.endpoint, registration.attempt
        task.registered_at = time.monotonic()
        task.registered.set()
        return web.json_response({"ok": True})

    async def _endpoint(self, request: web.Request) -> web.Response:
        task = self._task(request.query.get("task", ""))
        try:
            async with asyncio.timeout(60):
                await task.registered.wait()
        except TimeoutError:
            raise web.HTTPGatewayTimeout(text=f"task {request.query['task']} did not register") from None
        return web.json_response({"endpoint": task.endpoint})

    async def _done(self, request: web.Request) -> web.Response:
        report, _ = await self._message(request)
        report.done, report.done_at = True, time.monotonic()
        self.changed.set()
        return web.json_response({"ok": True})

    def _failed(self, task_id: str, error: str, refusal: Refusal | None) -> None:
        report = self.tasks[task_id]
        report.error, report.refusal = error, refusal
        self.changed.set()

    def processing_seconds(self) -> float:
        """From the last task's registration to the last task's end (0 when unknown)."""
        starts = [t.registered_at for t in self.tasks.values() if t.registered_at is not None]
        ends = [t.done_at for t in self.tasks.values() if t.done_at is not None]
        return max(ends) - max(starts) if starts and ends else 0.0

    async def _run(self, request: web.Request) -> web.Response:
        return web.json_response({"run": self.run})
