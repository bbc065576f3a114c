"""A task process's life, once for every way a job runs: serve, register, restore, connect, run, report.

A task process of `nopstream run` (forked by the runner, `local.worker`) and one of a
cluster job (a pod, or a child of `nopstream run --etcd`: `node.task`) live the same
life; only where they register, find their peers and their restore point, and what
ends them differ. That is their `Directory`: the runner's control server, or the etcd
registry and the run's restore point there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import aiohttp

from nopstream.checkpoint.epochs import Ack
from nopstream.checkpoint.restore import RestorePoint
from nopstream.checkpoint.storage import Storage
from nopstream.connectors.registry import Connectors
from nopstream.node import checkpointing
from nopstream.node.settings import int_variable
from nopstream.node.wire import guard
from nopstream.node.wire.coordinator_api import CoordinatorLink, push_stats
from nopstream.node.wire.messages import TaskIdentity, TaskStatus
from nopstream.node.wire.taskserver import TaskServer
from nopstream.node.wire.tls import JobTls
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.records import TaskSnapshot
from nopstream.runtime.pacing import TaskSettings
from nopstream.runtime.task import Task
from nopstream.runtime.transport_http import Fencing, HttpIO, HttpReceiver

log = logging.getLogger(__name__)


class Directory(Protocol):
    """Where a task process registers, finds its peers and its restore point, and says how it ended."""

    async def resolve(self, task_id: str) -> str:
        """The endpoint of task `task_id` of this run, once it has registered."""

    async def register(self, endpoint: str) -> None:
        """Say that this task serves at `endpoint`."""

    async def restore_point(self) -> RestorePoint:
        """The run's restore point; RestoreRefused when the run cannot start."""

    async def report(self, path: str, body: dict[str, Any]) -> None:
        """Post one message to the coordinator (`/stats`, `/failed`); aiohttp.ClientError if not taken."""

    async def failed(self, error: Exception, *, restoring: bool) -> None:
        """Tell of this task's failure (`restoring`: it could not restore); may end the process."""

    async def finished(self, task: Task, link: CoordinatorLink) -> None:
        """The task ran to its end and sent its last stats: return once the process may exit."""


async def live(
    plan: PartitionedPlan,
    deployment: DeploymentPlan,
    who: TaskIdentity,
    directory: Directory,
    link: CoordinatorLink,
    *,
    session: aiohttp.ClientSession,
    secret: str,
    bind: tuple[str, int, str],
    tls: JobTls | None = None,
) -> None:
    """Run task `who` of `plan` to its end, serving at `bind` (host, port, advertised host), over TLS
    with `tls`.

    Any failure is told to the directory (`restoring` while the run's restore point is
    read and applied) and raised.
    """
    server: TaskServer | None = None
    restoring = False
    try:
        task, receiver, listener = build_task(
            plan, deployment, who, session=session, resolve=directory.resolve, send=link.send
        )
        assert listener is not None  # a deployment binds storage
        server = TaskServer(
            task, receiver, listener, run=who.run, guard=guard.Guard(secret, certificates=tls is not None)
        )
        host, port, advertise = bind
        endpoint = await server.start(host, port, advertise=advertise, tls=tls)
        await directory.register(endpoint)
        log.info("task %s serves %s (run %d, attempt %s)", who.task_id, endpoint, who.run, who.attempt)
        restoring = True
        point = await directory.restore_point()
        await checkpointing.start_task(task, listener.storage, point)
        restoring = False
        log.info("task %s started from %s", who.task_id, point)
        await task.connect()
        await _run(task, directory)
        with contextlib.suppress(aiohttp.ClientError):
            await directory.report("/stats", task.stats().to_json())
        await directory.finished(task, link)
        log.info(task.summary())
    except Exception as exc:
        await directory.failed(exc, restoring=restoring)
        raise
    finally:
        await link.close()
        if server is not None:
            await server.close()


async def _run(task: Task, directory: Directory) -> None:
    """Run the task to its end, its stats posted meanwhile."""
    stats = asyncio.create_task(push_stats(task, directory.report), name="stats")
    try:
        await task.run()
    finally:
        stats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stats


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

    def status(self, run: int) -> TaskStatus:
        """What it reported, as a coordinator that takes over asks for it (GET /control/status)."""
        return TaskStatus(run, self.source_finished, self.last_ack)


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
