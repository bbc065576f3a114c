"""A task process of the local runner: one subtask over http channels (`node.tasklife`).

Its directory is the runner's control server: it registers there, finds the downstream
tasks' servers there, takes its restore point from the runner (in its settings), and
reports done or failed there. A crash is a crash: the runner sees the exit code.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from nopstream import errors
from nopstream.checkpoint.restore import RestorePoint
from nopstream.cluster.registry import Registration
from nopstream.node import tasklife
from nopstream.node.wire import guard
from nopstream.node.wire.coordinator_api import CoordinatorLink
from nopstream.node.wire.messages import TaskIdentity
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.runtime.task import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSettings:
    """Who this process is, where it reports, and the run's restore point; the run's plans, rebuilt
    from their documents by the runner and handed over in the forked memory."""

    plan: PartitionedPlan
    deployment: DeploymentPlan
    task_id: str
    control_url: str
    run: int
    attempt: str
    secret: str = field(repr=False)
    restore: RestorePoint
    host: str = "127.0.0.1"


class _ControlServer:
    """`tasklife.Directory` over the runner's control server."""

    def __init__(self, session: aiohttp.ClientSession, settings: WorkerSettings) -> None:
        self.session = session
        self.settings = settings
        self.url = settings.control_url
        self.me = {"taskId": settings.task_id, "run": settings.run}

    async def resolve(self, task_id: str) -> str:
        async with self.session.get(f"{self.url}/endpoint", params={"task": task_id}) as resp:
            resp.raise_for_status()
            endpoint: str = (await resp.json())["endpoint"]
            return endpoint

    async def register(self, endpoint: str) -> None:
        await self.report(
            "/register", Registration(self.settings.task_id, self.settings.attempt, endpoint).to_json()
        )

    async def restore_point(self) -> RestorePoint:
        return self.settings.restore

    async def report(self, path: str, body: dict[str, Any]) -> None:
        async with self.session.post(f"{self.url}{path}", json={**self.me, **body}) as resp:
            resp.raise_for_status()

    async def failed(self, error: Exception, *, restoring: bool) -> None:
        # a refusal (its restore point, a connector, a bad record) says so: the runner does not recover it
        with contextlib.suppress(aiohttp.ClientError):
            await self.report("/failed", errors.failure_report(error))

    async def finished(self, task: Task, link: CoordinatorLink) -> None:
        await link.flush()  # the coordinator has every ACK before this process may exit
        await self.report("/done", {})


async def serve(settings: WorkerSettings) -> None:
    """Run one task to completion; report to the control server."""
    plan, deployment = settings.plan, settings.deployment
    who = TaskIdentity(settings.task_id, settings.run, settings.attempt)
    async with aiohttp.ClientSession(headers=guard.headers(settings.secret)) as session:
        directory = _ControlServer(session, settings)

        async def leader() -> str:
            return settings.control_url

        link = CoordinatorLink(session, leader, who)  # ACKs and source-finished, retried
        bind = (settings.host, 0, settings.host)
        await tasklife.live(
            plan, deployment, who, directory, link, session=session, secret=settings.secret, bind=bind
        )
