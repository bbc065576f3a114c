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
from typing import Any, Protocol

import aiohttp

from nopstream.checkpoint.restore import RestorePoint
from nopstream.node import checkpointing, guard
from nopstream.node.coordinator_api import CoordinatorLink, push_stats
from nopstream.node.taskserver import TaskIdentity, TaskServer, build_task
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.runtime.task import Task

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
) -> None:
    """Run task `who` of `plan` to its end, serving at `bind` (host, port, advertised host).

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
        server = TaskServer(task, receiver, listener, run=who.run, guard=guard.Guard(secret))
        host, port, advertise = bind
        endpoint = await server.start(host, port, advertise=advertise)
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
