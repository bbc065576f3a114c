"""A task process of the local runner: one subtask over http channels.

It loads the plan document, builds its Task, serves it on a loopback port
(`node.taskserver`), registers with the runner's control server, connects its
outputs to the downstream tasks' servers, runs, and reports done or failed. A crash
is a crash: the runner sees the exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from nopstream import errors
from nopstream.checkpoint.restore import RestorePoint
from nopstream.node import checkpointing, guard
from nopstream.node.coordinator_api import CoordinatorLink, push_stats
from nopstream.node.taskserver import TaskIdentity, TaskServer, build_task
from nopstream.plan import compiler
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSettings:
    """Who this process is and where it reports."""

    plan_path: Path
    task_id: str
    control_url: str
    run: int
    attempt: str
    secret: str = field(repr=False)
    deployment_path: Path | None = None
    restore: RestorePoint | None = None
    host: str = "127.0.0.1"


async def serve(settings: WorkerSettings) -> None:
    """Run one task to completion; report to the control server."""
    plan = compiler.read_document(settings.plan_path, PartitionedPlan)
    who = TaskIdentity(settings.task_id, settings.run, settings.attempt)
    async with aiohttp.ClientSession(headers=guard.headers(settings.secret)) as session:
        control = settings.control_url
        me = {"taskId": settings.task_id, "run": settings.run}

        async def post(path: str, body: dict[str, Any]) -> None:
            async with session.post(f"{control}{path}", json={**me, **body}) as resp:
                resp.raise_for_status()

        async def leader() -> str:
            return control

        link = CoordinatorLink(session, leader, who)  # ACKs and source-finished, retried

        async def resolve(task_id: str) -> str:
            async with session.get(f"{control}/endpoint", params={"task": task_id}) as resp:
                resp.raise_for_status()
                endpoint: str = (await resp.json())["endpoint"]
                return endpoint

        try:
            deployment = (
                compiler.read_document(settings.deployment_path, DeploymentPlan)
                if settings.deployment_path
                else None
            )
            task, receiver, listener = build_task(
                plan, deployment, who, session=session, resolve=resolve, send=link.send
            )
            if listener is not None and settings.restore is not None:
                await checkpointing.start_task(task, listener.storage, settings.restore)
        except Exception as exc:
            await post("/failed", errors.failure_report(exc))
            raise
        server = TaskServer(task, receiver, listener, run=settings.run, guard=guard.Guard(settings.secret))
        endpoint = await server.start(settings.host, 0)
        try:
            await post("/register", {"attempt": settings.attempt, "endpoint": endpoint})
            log.info(
                "task %s serves %s (run %d, attempt %s)",
                settings.task_id,
                endpoint,
                settings.run,
                settings.attempt,
            )
            await task.connect()
            log.info("task %s connected its outputs", settings.task_id)
            stats = asyncio.create_task(push_stats(task, post), name="stats")
            try:
                await task.run()
            finally:
                stats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stats
            await link.flush()  # the coordinator has every ACK before this process may exit
            await post("/stats", task.stats().to_json())
            await post("/done", {})
            log.info(task.summary())
        except Exception as exc:  # a bad record is a refusal: the same on every run, not recovered
            with contextlib.suppress(aiohttp.ClientError):
                await post("/failed", errors.failure_report(exc))
            raise
        finally:
            await link.close()
            await server.close()
