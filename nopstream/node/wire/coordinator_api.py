"""The coordinator's side of the wire, once for every way a job runs.

`CoordinatorRoutes` is the HTTP face of whoever coordinates a job's epochs: the local
runner's control server (`nopstream run`) and each coordinator process
(`nopstream coordinator`, in a pod or under `nopstream run --etcd`):
  POST /ack {taskId, run, epoch, segments, sources, sinks}   a task's checkpoint ACK
  POST /source-finished {taskId, run}                         a source read all its input
  POST /stats {taskId, run, recordsIn, recordsOut, ...}       a task's counters (`TaskStats`)
  POST /failed {taskId, run, error[, refused]}                a task failed (its traceback)
  POST /savepoint  (`?stop=true`: stop at it, for an upgrade)  make the next epoch a savepoint
  GET  /api/v1/job                                            the job's view (`node.view.jobview`)
  GET  /dashboard/                                            the dashboard's page (open: no data)
  GET  /metrics                                               Prometheus metrics
A task's message without its task id and run is refused with 400, one for a run this
coordinator does not lead with 409, and an ACK or source-finished while it leads no
run with 503 (tasks retry it). `CoordinatorLink` is the one client of these routes
(every task's), `TaskCommands` the one client of the tasks' commands
(`node.wire.taskserver`): barrier, commit and status, fenced by run and token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from nopstream.checkpoint.epochs import Ack, EpochCoordinator
from nopstream.cluster.backend import StoreUnavailable
from nopstream.cluster.errors import Fenced
from nopstream.errors import Refusal
from nopstream.node.view.epoch_metrics import CoordinatorCollector
from nopstream.node.view.jobview import DASHBOARD_FILES, JobHistory, job_view
from nopstream.node.wire.guard import Guard, GuardCollector, healthz, int_field, json_body
from nopstream.node.wire.messages import Command, TaskIdentity, TaskStatus
from nopstream.plan.epochs import EpochKind
from nopstream.runtime.metrics import TaskStats, exposition
from nopstream.runtime.task import Task

log = logging.getLogger(__name__)
RETRY = 0.2
STATS_INTERVAL = 0.5
DASHBOARD_PATH = "/dashboard/"


Failed = Callable[[str, str, Refusal | None], None]
"""Told of a task's failure: its task id, its error and its refusal (None: a plain failure)."""


class CoordinatorRoutes:
    """The routes above, for the run this process leads (if any)."""

    def __init__(
        self,
        task_ids: tuple[str, ...],
        guard: Guard,
        history: JobHistory,
        *,
        on_failed: Failed | None = None,
    ) -> None:
        """Take messages of these tasks from clients `guard` admits; what they tell goes to `history`."""
        self.task_ids = frozenset(task_ids)
        self.guard = guard
        self.history = history
        self.on_failed = on_failed
        self.current: EpochCoordinator | None = None
        self.leading_run = 0
        self.recoveries = 0
        self.state = "starting"  # then running, finished: what the view says of the job

    def lead(self, coordinator: EpochCoordinator | None, run: int, *, recoveries: int) -> None:
        """Take messages for `run` to `coordinator` (None: lead nothing for now)."""
        self.current, self.leading_run, self.recoveries = coordinator, run, recoveries
        if coordinator is not None:
            self.state = "running"

    def add_to(self, app: web.Application) -> None:
        """Add the routes to an application (guarded by the same guard)."""
        app.router.add_post("/ack", self._ack)
        app.router.add_post("/source-finished", self._source_finished)
        app.router.add_post("/stats", self._stats)
        app.router.add_post("/failed", self._failed)
        app.router.add_post("/savepoint", self._savepoint)
        app.router.add_get("/api/v1/job", self._job)
        app.router.add_get("/dashboard", self._to_dashboard)
        app.router.add_get(DASHBOARD_PATH, self._dashboard)  # before the files: it matches first
        app.router.add_static(DASHBOARD_PATH, DASHBOARD_FILES, append_version=False)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", healthz)

    async def message(
        self, request: web.Request, *required: str, leading: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """The task and body of a message from a task of the run led (400, 404, 409 otherwise).

        With `leading`, a message for the coordinator itself: 503 (the task retries) while
        it leads no run yet or an older one than the message's, 409 only for an older run.
        """
        body = await json_body(request, "taskId", "run", *required)
        run = int_field(body, "run")
        if leading and (self.current is None or run > self.leading_run):
            raise web.HTTPServiceUnavailable(text=f"not leading run {run} yet")
        if run != self.leading_run:
            raise web.HTTPConflict(text=f"stale run {run}: the current run is {self.leading_run}")
        task_id = body["taskId"]
        if task_id not in self.task_ids:
            raise web.HTTPNotFound(text=f"unknown task {task_id!r}")
        return task_id, body

    def _leading(self) -> EpochCoordinator:
        if self.current is None:
            raise web.HTTPServiceUnavailable(text="not leading a run yet")
        return self.current

    async def _ack(self, request: web.Request) -> web.Response:
        task_id, body = await self.message(request, "epoch", "segments", leading=True)
        try:
            ack = Ack.from_json(body)
        except ValueError as err:
            raise web.HTTPBadRequest(text=str(err)) from None
        self._leading().ack(task_id, int_field(body, "epoch"), ack)
        return web.json_response({"ok": True})

    async def _source_finished(self, request: web.Request) -> web.Response:
        task_id, _ = await self.message(request, leading=True)
        self._leading().source_finished(task_id)
        return web.json_response({"ok": True})

    async def _stats(self, request: web.Request) -> web.Response:
        task_id, body = await self.message(request)
        try:
            stats = TaskStats.from_json(body)
        except ValueError as err:
            raise web.HTTPBadRequest(text=str(err)) from None
        self.history.stats(task_id, self.leading_run, stats)
        return web.json_response({"ok": True})

    async def _failed(self, request: web.Request) -> web.Response:
        task_id, body = await self.message(request)
        error = str(body.get("error", "unknown error"))
        self.history.failed(self.leading_run, task_id, error)
        if self.on_failed is not None:
            self.on_failed(task_id, error, Refusal.from_json(body))
        return web.json_response({"ok": True})

    async def _job(self, request: web.Request) -> web.Response:
        current = self.current
        view = job_view(
            self.history,
            latest_durable=current.latest_durable if current is not None else None,
            latest_committed=current.latest_committed if current is not None else None,
            state=self.state,
        )
        return web.json_response(view)

    async def _to_dashboard(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(DASHBOARD_PATH)

    async def _dashboard(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(DASHBOARD_FILES / "index.html")

    async def _savepoint(self, request: web.Request) -> web.Response:
        current = self._leading()
        if current.finishing:
            raise web.HTTPConflict(text="the job is finishing: no savepoint can follow its final epoch")
        current.request_savepoint(stop=request.query.get("stop") == "true")
        return web.json_response({"requested": True, "savepoints": current.savepoints})

    async def _metrics(self, request: web.Request) -> web.Response:
        registry = CollectorRegistry()
        if self.current is not None:
            registry.register(CoordinatorCollector(self.current, recoveries=self.recoveries))
        registry.register(GuardCollector(self.guard))
        return web.Response(body=exposition(registry), content_type="text/plain")


Leader = Callable[[], Awaitable[str | None]]
"""The endpoint of the coordinator that leads now (None while none does)."""


class LinkRefused(RuntimeError):
    """The coordinator refused a task's message for a reason a retry cannot mend (400, 401, 404)."""


class CoordinatorLink:
    """A task's messages to the leading coordinator, in order, each retried until delivered.

    Through a failover, or while the coordinator leads no run yet (503), a message
    waits. A 409 says the coordinator leads another run: the message is obsolete and
    dropped. Any other refusal ends the link with LinkRefused, raised by the next
    `send` or `flush`: a task never goes on without its ACKs being taken.
    """

    def __init__(self, session: aiohttp.ClientSession, leader: Leader, who: TaskIdentity) -> None:
        """Send as task `who` to whoever `leader` names."""
        self.session = session
        self.leader = leader
        self.who = who
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None

    async def send(self, path: str, body: dict[str, Any]) -> None:
        """Queue a message; it is delivered in the background."""
        if self._sender is None:
            self._sender = asyncio.create_task(self._deliver(), name="coordinator link")
        elif self._sender.done():
            self._sender.result()  # raises what ended it
        self.queue.put_nowait((path, {"taskId": self.who.task_id, "run": self.who.run, **body}))

    async def flush(self) -> None:
        """Return once every message queued so far is delivered (or dropped as obsolete)."""
        if self._sender is None:
            return
        drained = asyncio.ensure_future(self.queue.join())
        await asyncio.wait({drained, self._sender}, return_when=asyncio.FIRST_COMPLETED)
        if not drained.done():
            drained.cancel()
            self._sender.result()

    async def post_now(self, path: str, body: dict[str, Any]) -> bool:
        """Send a message once, outside the queue (stats, a failure report); whether it was taken."""
        message = {"taskId": self.who.task_id, "run": self.who.run, **body}
        try:
            return await self._post_once(path, message)
        except LinkRefused as refused:
            log.warning("%s", refused)
            return False

    async def close(self) -> None:
        """Stop sending."""
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, LinkRefused):
                await self._sender

    async def _deliver(self) -> None:
        while True:
            path, body = await self.queue.get()
            while not await self._post_once(path, body):
                await asyncio.sleep(RETRY)
            self.queue.task_done()

    async def _post_once(self, path: str, body: dict[str, Any]) -> bool:
        """Whether the message is done with (delivered, or obsolete)."""
        try:
            endpoint = await self.leader()
            if endpoint is None:
                return False
            async with self.session.post(f"{endpoint}{path}", json=body) as resp:
                if resp.status == 409:
                    log.info("coordinator dropped %s: %s", path, await resp.text())
                    return True
                if resp.status in (400, 401, 404):
                    raise LinkRefused(f"the coordinator refused {path} ({resp.status}): {await resp.text()}")
                return resp.status < 300
        except (aiohttp.ClientError, StoreUnavailable, TimeoutError) as exc:
            log.info("coordinator unreachable for %s (%s); retrying", path, exc)
            return False


Post = Callable[[str, dict[str, Any]], Awaitable[object]]
"""Post a task's message to its coordinator, once."""


async def push_stats(task: Task, post: Post) -> None:
    """Post the task's stats every STATS_INTERVAL seconds until cancelled; a lost post is not retried."""
    while True:
        await asyncio.sleep(STATS_INTERVAL)
        with contextlib.suppress(aiohttp.ClientError):
            await post("/stats", task.stats().to_json())


Endpoint = Callable[[str], Awaitable[str]]
"""The endpoint (base URL) of a task of the run."""


class TaskCommands:
    """The coordinator's commands to the tasks of one run (`leading.Commands` over HTTP), each retried
    until the task answers.

    A task that does not answer is retried every RETRY seconds: a task that died ends
    the run by another path (its supervisor or its pod's failure), and one that
    finished its work and exited (`finished`) is no longer asked. A 409 means the
    task is in another run or has seen a higher token: this coordinator is deposed
    (`Fenced`).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        endpoint: Endpoint,
        *,
        sources: tuple[str, ...],
        tasks: tuple[str, ...],
        run: int,
        token: int,
        finished: Callable[[str], bool] = lambda task_id: False,
    ) -> None:
        """Command `tasks` (`sources` among them) of run `run` with fencing token `token`."""
        self.session = session
        self.endpoint = endpoint
        self.sources = sources
        self.tasks = tasks
        self.finished = finished
        self.run, self.token = run, token

    async def barrier(self, epoch: int, kind: EpochKind) -> None:
        """Ask each source task to inject barrier `epoch` of `kind`."""
        body = Command(epoch, self.run, self.token, str(kind)).to_json()
        await asyncio.gather(*(self._call(t, "POST", "/control/barrier", body) for t in self.sources))

    async def commit(self, epoch: int) -> None:
        """Tell each task that epochs up to `epoch` are durable."""
        body = Command(epoch, self.run, self.token).to_json()
        await asyncio.gather(*(self._call(t, "POST", "/control/commit", body) for t in self.tasks))

    async def status(self) -> dict[str, TaskStatus]:
        """Each task's status: its run, whether its source finished, its last ACK."""
        answers = await asyncio.gather(*(self._call(t, "GET", "/control/status", None) for t in self.tasks))
        return {t: TaskStatus.from_json(a) for t, a in zip(self.tasks, answers, strict=True)}

    async def _call(
        self, task_id: str, method: str, path: str, body: dict[str, Any] | None
    ) -> dict[str, Any]:
        while not self.finished(task_id):
            url = await self.endpoint(task_id)
            try:
                async with self.session.request(method, f"{url}{path}", json=body) as resp:
                    if resp.status == 409:
                        raise Fenced(f"task {task_id} refused {path}: {await resp.text()}")
                    resp.raise_for_status()
                    answer: dict[str, Any] = await resp.json()
                    return answer
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.info("task %s unreachable for %s (%s); retrying", task_id, path, exc)
                await asyncio.sleep(RETRY)
        return {}
