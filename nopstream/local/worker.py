"""A task process of the local runner (`nopstream task`): one subtask over http channels.

It loads the plan document, builds its Task, serves its channels on a loopback
port, registers with the runner's control server, connects its outputs to the
downstream tasks' servers, runs, and reports done or failed. A crash is a crash:
the runner sees the exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from nopstream.checkpoint.storage import Storage
from nopstream.connectors.registry import Connectors
from nopstream.local import checkpointing
from nopstream.plan import compiler
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.runtime.metrics import TaskCollector, exposition
from nopstream.runtime.task import Task
from nopstream.runtime.transport_http import Fencing, HttpIO, HttpReceiver

log = logging.getLogger(__name__)
STATS_INTERVAL = 0.5


@dataclass(frozen=True)
class WorkerSettings:
    """Who this process is and where it reports."""

    plan_path: Path
    task_id: str
    control_url: str
    run: int
    attempt: str
    deployment_path: Path | None = None
    restore_epoch: int | None = None
    host: str = "127.0.0.1"


def load_plan(path: Path) -> PartitionedPlan:
    """The PartitionedPlan of a plan document file."""
    plan = compiler.load_document(path.read_text(), origin=str(path))
    if not isinstance(plan, PartitionedPlan):
        raise ValueError(f"{path} holds a {compiler.layer_name(plan)} plan, not a partitioned plan")
    return plan


def locate(plan: PartitionedPlan, task_id: str) -> tuple[str, int]:
    """(vertex id, subtask index) of a task id of the plan."""
    for v in plan.vertices:
        for s in v.subtasks:
            if s.task_id == task_id:
                return v.vertex_id, s.index
    raise KeyError(f"task {task_id} is not in the plan")


async def serve(settings: WorkerSettings) -> None:
    """Run one task to completion; report to the control server."""
    plan = load_plan(settings.plan_path)
    vertex_id, subtask = locate(plan, settings.task_id)
    fencing = Fencing(plan.identity.job_id, plan.identity.pipeline_id, lambda: settings.run)
    receiver = HttpReceiver(fencing)
    async with aiohttp.ClientSession() as session:
        control = settings.control_url

        async def post(path: str, body: dict[str, Any]) -> None:
            async with session.post(f"{control}{path}", json={"taskId": settings.task_id, **body}) as resp:
                resp.raise_for_status()

        async def resolve(task_id: str) -> str:
            async with session.get(f"{control}/endpoint", params={"task": task_id}) as resp:
                resp.raise_for_status()
                endpoint: str = (await resp.json())["endpoint"]
                return endpoint

        io = HttpIO(receiver, session, resolve, run=settings.run, attempt=settings.attempt)
        try:
            listener = None
            if settings.deployment_path is not None:
                deployment = compiler.load_document(settings.deployment_path.read_text())
                if not isinstance(deployment, DeploymentPlan):
                    raise ValueError(f"{settings.deployment_path} is not a deployment plan document")
                listener = _ControlListener(checkpointing.open_storage(deployment), post)
            task = Task(
                plan, vertex_id, subtask, io=io, connectors=Connectors(plan.identity), listener=listener
            )
            if listener is not None and settings.restore_epoch is not None:
                restore = checkpointing.find_restore_point(
                    listener.storage, plan, epoch=settings.restore_epoch
                )
                if restore is not None:
                    checkpointing.restore_task(task, restore)
        except Exception:
            await post("/failed", {"error": traceback.format_exc(limit=5)})
            raise
        app = web.Application()
        receiver.routes(app)

        async def barrier(request: web.Request) -> web.Response:
            body = await request.json()
            task.trigger_barrier(int(body["epoch"]), body.get("kind", "checkpoint"))
            return web.json_response({"ok": True})

        async def commit(request: web.Request) -> web.Response:
            body = await request.json()
            task.commit(int(body["epoch"]))
            return web.json_response({"ok": True})

        registry = CollectorRegistry()
        registry.register(TaskCollector(lambda: [task], semantic_mode=plan.identity.semantic_mode.value))

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=exposition(registry), content_type="text/plain")

        app.router.add_get("/metrics", metrics)
        app.router.add_post("/control/barrier", barrier)
        app.router.add_post("/control/commit", commit)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, settings.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        endpoint = f"http://{settings.host}:{port}"
        try:
            await post("/register", {"attempt": settings.attempt, "run": settings.run, "endpoint": endpoint})
            log.info(
                "task %s serves %s (run %d, attempt %s)",
                settings.task_id,
                endpoint,
                settings.run,
                settings.attempt,
            )
            await task.connect()
            log.info("task %s connected its outputs", settings.task_id)
            stats = asyncio.create_task(_push_stats(task, post), name="stats")
            try:
                await task.run()
            finally:
                stats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stats
            await post("/stats", _stats_body(task))
            await post("/done", {})
            log.info(
                "task %s finished: %d records in, %d out",
                settings.task_id,
                task.metrics.records_in,
                task.metrics.records_out,
            )
        except Exception:
            with contextlib.suppress(aiohttp.ClientError):
                await post("/failed", {"error": traceback.format_exc(limit=8)})
            raise
        finally:
            await runner.cleanup()


class _ControlListener:
    """A task process's checkpointing side: segments to storage, ACKs to the control server."""

    def __init__(self, storage: Storage, post: Callable[[str, dict[str, Any]], Awaitable[None]]) -> None:
        self.storage = storage
        self.post = post

    async def on_snapshot(self, task: Task, epoch: int, kind: str, state: dict[str, Any]) -> None:
        ack = await checkpointing.write_snapshot_async(self.storage, task, epoch, state)
        await self.post(
            "/ack", {"epoch": epoch, "segments": ack.segments, "sources": ack.sources, "sinks": ack.sinks}
        )

    async def on_source_finished(self, task: Task) -> None:
        await self.post("/source-finished", {})


def _stats_body(task: Task) -> dict[str, Any]:
    m = task.metrics
    return {
        "recordsIn": m.records_in,
        "recordsOut": m.records_out,
        "watermark": m.watermark,
        "channels": task.channel_stats(),
    }


async def _push_stats(task: Task, post: Any) -> None:
    while True:
        await asyncio.sleep(STATS_INTERVAL)
        with contextlib.suppress(aiohttp.ClientError):
            await post("/stats", _stats_body(task))
