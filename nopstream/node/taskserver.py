"""A task process's side of the wire, shared by the local runner's task processes and task pods.

One HTTP server per task carries its input channels (`runtime.transport_http`), the
coordinator's commands, its status and its metrics:
  POST /control/barrier {epoch, kind, run, token}  a source injects barrier `epoch`
  POST /control/commit  {epoch, run, token}        epochs up to `epoch` are durable
  GET  /control/status                             run, sourceFinished, the last ACK
  GET  /metrics                                    Prometheus metrics
  GET  /healthz                                    200 while the process serves
Every route but the last two needs the job's secret (`node.guard`: 401). A command
without its run and token is refused with 400, one of another run, or with a fencing
token lower than the highest this task has seen, with 409 (both counted in the
fenced-attempts metric): a deposed coordinator can no longer make a task act.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from nopstream.checkpoint.epochs import Ack
from nopstream.checkpoint.storage import Storage
from nopstream.cluster.fencing import TokenGate
from nopstream.connectors.registry import Connectors
from nopstream.node import checkpointing
from nopstream.node.guard import Guard, GuardCollector, healthz, json_body
from nopstream.node.settings import int_variable
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.records import TaskSnapshot
from nopstream.runtime.metrics import TaskCollector, exposition
from nopstream.runtime.pacing import TaskSettings
from nopstream.runtime.task import Task
from nopstream.runtime.transport_http import Fencing, HttpIO, HttpReceiver

log = logging.getLogger(__name__)

Send = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Send a message (path, JSON body) to the coordinator."""
Resolve = Callable[[str], Awaitable[str]]
"""The endpoint of a task of the same run."""


def locate(plan: PartitionedPlan, task_id: str) -> tuple[str, int]:
    """(vertex id, subtask index) of a task id of the plan."""
    for v in plan.vertices:
        for s in v.subtasks:
            if s.task_id == task_id:
                return v.vertex_id, s.index
    raise KeyError(f"task {task_id} is not in the plan")


class ReportingListener:
    """Writes a task's segments and reports to its coordinator; remembers what it reported.

    A coordinator that takes over mid-epoch asks each task (GET /control/status)
    for what it may have sent to its predecessor: whether its source finished and
    its last ACK.
    """

    def __init__(self, storage: Storage, send: Send) -> None:
        """Write segments to `storage`; send ACKs and source-finished through `send`."""
        self.storage = storage
        self.send = send
        self.source_finished = False
        self.last_ack: tuple[int, Ack] | None = None

    async def on_snapshot(self, task: Task, epoch: int, kind: EpochKind, state: TaskSnapshot) -> None:
        ack = await checkpointing.write_snapshot_async(self.storage, task, epoch, state)
        self.last_ack = (epoch, ack)
        await self.send("/ack", ack.to_json(epoch))

    async def on_source_finished(self, task: Task) -> None:
        self.source_finished = True
        await self.send("/source-finished", {})


@dataclass(frozen=True)
class TaskStatus:
    """What a task tells a coordinator that takes over: its run, whether its source finished, its last ACK."""

    run: int
    source_finished: bool = False
    last_ack: tuple[int, Ack] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON of GET /control/status."""
        ack = self.last_ack[1].to_json(self.last_ack[0]) if self.last_ack else None
        return {"run": self.run, "sourceFinished": self.source_finished, "ack": ack}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> TaskStatus:
        """Parse `to_json`'s output; ValueError when a part has another shape."""
        ack = body.get("ack")
        last = (int(ack["epoch"]), Ack.from_json(ack)) if isinstance(ack, dict) else None
        return cls(int(body["run"]), bool(body.get("sourceFinished")), last)


@dataclass(frozen=True)
class Command:
    """A coordinator's command to a task of its run (POST /control/barrier with its `kind`, POST
    /control/commit), fenced by the run and the coordinator's token."""

    epoch: int
    run: int
    token: int
    kind: str | None = None
    """A barrier's kind, as sent: read with `epoch_kind` once the command is admitted."""

    def to_json(self) -> dict[str, Any]:
        """The command's body."""
        body: dict[str, Any] = {"epoch": self.epoch, "run": self.run, "token": self.token}
        return body if self.kind is None else {**body, "kind": self.kind}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Command:
        """From its body (run, token and epoch present); ValueError naming a field that is not an integer."""
        run, token, epoch = (_integer(body, name) for name in ("run", "token", "epoch"))
        kind = body.get("kind")
        return cls(epoch, run, token, None if kind is None else str(kind))

    def epoch_kind(self) -> EpochKind:
        """The barrier's kind (a checkpoint when it names none); ValueError naming the kinds otherwise."""
        try:
            return EpochKind(self.kind if self.kind is not None else EpochKind.CHECKPOINT)
        except ValueError:
            raise ValueError(f"kind must be one of {', '.join(EpochKind)}") from None


def _integer(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer")
    return value


@dataclass(frozen=True)
class TaskIdentity:
    """Which task of which run this process is."""

    task_id: str
    run: int
    attempt: str


def task_settings(env: Mapping[str, str] = os.environ) -> TaskSettings:
    """The settings of a task process (`node.settings` lists the variables); SettingsError names a
    malformed one."""
    target = int(TaskSettings.batch_target_ms)
    return TaskSettings(
        batch_size=int_variable(env, "NOPSTREAM_BATCH_SIZE", TaskSettings.batch_size, minimum=1),
        batch_target_ms=int_variable(env, "NOPSTREAM_BATCH_TARGET_MS", target, minimum=1),
        source_pause_ms=int_variable(env, "NOPSTREAM_SOURCE_PAUSE_MS", 0, minimum=0),
    )


def build_task(
    plan: PartitionedPlan,
    deployment: DeploymentPlan | None,
    who: TaskIdentity,
    *,
    session: aiohttp.ClientSession,
    resolve: Resolve,
    send: Send,
) -> tuple[Task, HttpReceiver, ReportingListener | None]:
    """A task over http channels; checkpointing when a deployment plan binds storage."""
    vertex_id, subtask = locate(plan, who.task_id)
    receiver = HttpReceiver(Fencing(plan.identity.job_id, plan.identity.pipeline_id, lambda: who.run))
    io = HttpIO(receiver, session, resolve, run=who.run, attempt=who.attempt)
    listener = None
    if deployment is not None:
        listener = ReportingListener(checkpointing.open_storage(deployment), send)
    connectors = Connectors(plan.identity)
    settings = task_settings()
    task = Task(plan, vertex_id, subtask, io=io, connectors=connectors, listener=listener, settings=settings)
    return task, receiver, listener


class TaskServer:
    """Serves one task's channels, commands, status and metrics on one port."""

    def __init__(
        self,
        task: Task,
        receiver: HttpReceiver,
        listener: ReportingListener | None,
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

    async def start(self, host: str, port: int, *, advertise: str | None = None) -> str:
        """Listen on host:port (0: any free port); the endpoint others reach it at."""
        # A task that stops (it cannot start, or fails) does not wait for the channels upstream
        # tasks still hold open to it: aiohttp would give open handlers a minute.
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://{advertise or host}:{bound}"

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
        listener = self.listener
        status = (
            TaskStatus(self.run, listener.source_finished, listener.last_ack)
            if listener
            else TaskStatus(self.run)
        )
        return web.json_response(status.to_json())

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=exposition(self.registry), content_type="text/plain")
