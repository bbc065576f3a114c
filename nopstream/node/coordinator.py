"""A coordinator pod's process (`nopstream coordinator`): campaigns, and while it leads drives the epochs.

Two or more run per job; one leads (`cluster.election`), the others wait. The
leader leads the current run: it fixes the run's restore point (`checkpoint.restore`,
from storage, once per run, a fenced write; a job whose final epoch is durable is
finished, and its tasks only recover their sinks), waits until every task of the run
has registered, asks each task what it may have told a predecessor (source
finished, last ACK), settles what that predecessor left in the epoch log (a DURABLE
epoch is committed again; an epoch in flight in this run is adopted and completed;
one of an older run is aborted), then runs the `EpochCoordinator` over HTTP. When
the run changes (a global recovery) it stops, waits for any manifest write still
running, and leads the new run. The job is over when the final epoch is committed;
a standby that wins after that finds it so in the log and exits 0 too. A lost
lease or a refused fenced write ends the process non-zero (crash-only).

HTTP: POST /ack, POST /source-finished (from tasks: taskId and run required, 409 when
the run is not the one it leads), POST /savepoint (`?stop=true`: stop with a savepoint,
for an upgrade), GET /metrics, GET /healthz; all but the last two need the job's secret
(`node.guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from nopstream.checkpoint import catalog, restore
from nopstream.checkpoint.coordinator import Ack, CoordinatorSettings, EpochCoordinator
from nopstream.checkpoint.errors import RestoreRefused
from nopstream.checkpoint.metrics import CoordinatorCollector
from nopstream.checkpoint.restore import NewLineage, RestorePoint
from nopstream.checkpoint.storage import Storage
from nopstream.cluster.backend import StoreUnavailable
from nopstream.cluster.election import Election, Leadership
from nopstream.cluster.epochlog import EpochEntry, EpochLog, EpochState
from nopstream.cluster.errors import Fenced
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.leases import LeaseKeeper
from nopstream.cluster.registry import Registry
from nopstream.node import checkpointing, guard
from nopstream.node.settings import NodeSettings
from nopstream.node.taskserver import ack_of, load_deployment, load_plan
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.runtime.metrics import exposition

log = logging.getLogger(__name__)
RETRY = 0.2


class CoordinatorProcess:
    """One coordinator candidate of one job."""

    def __init__(self, settings: NodeSettings, plan: PartitionedPlan, deployment: DeploymentPlan) -> None:
        """A candidate named by the settings' attempt."""
        self.settings = settings
        self.plan = plan
        self.deployment = deployment
        self.backend = EtcdBackend(settings.etcd_host, settings.etcd_port)
        self.layout = Layout(deployment.namespace, plan.identity.job_id, plan.identity.pipeline_id)
        self.registry = Registry(self.backend, self.layout)
        self.epoch_log = EpochLog(self.backend, self.layout)
        self.storage: Storage = checkpointing.open_storage(deployment)
        self.current: EpochCoordinator | None = None
        self.leading_run = 0
        self.guard = guard.Guard(settings.secret)
        self.app = self.guard.application()
        self.app.router.add_post("/ack", self._ack)
        self.app.router.add_post("/source-finished", self._source_finished)
        self.app.router.add_post("/savepoint", self._savepoint)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._healthz)

    async def serve(self) -> int:
        """Serve, campaign, lead until the job is over (0) or the lease is lost (1)."""
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.host, self.settings.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        endpoint = f"http://{self.settings.advertise}:{port}"
        try:
            await _reachable(self.backend)
            async with (
                LeaseKeeper(self.backend, self.settings.lease_ttl) as keeper,
                aiohttp.ClientSession(headers=guard.headers(self.settings.secret)) as session,
            ):
                leading = asyncio.create_task(self._lead(keeper, endpoint, session), name="lead")
                lost = asyncio.create_task(keeper.lost.wait(), name="lease")
                await asyncio.wait({leading, lost}, return_when=asyncio.FIRST_COMPLETED)
                lost.cancel()
                if not leading.done():
                    leading.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await leading
                    log.error("coordinator %s lost its lease: it stops acting", self.settings.attempt)
                    return 1
                return leading.result()
        finally:
            await runner.cleanup()
            await self.backend.close()

    async def _lead(self, keeper: LeaseKeeper, endpoint: str, session: aiohttp.ClientSession) -> int:
        election = Election(self.backend, self.layout, self.settings.attempt, endpoint=endpoint)
        leadership = await election.campaign(keeper)
        log.info("coordinator %s leads at %s (token %d)", self.settings.attempt, endpoint, leadership.token)
        try:
            while True:
                run = await self._run_changed(0)
                lead = asyncio.create_task(self._lead_run(leadership, run, session), name=f"run {run}")
                moved = asyncio.create_task(self._run_changed(run), name="run watch")
                await asyncio.wait({lead, moved}, return_when=asyncio.FIRST_COMPLETED)
                if lead.done():
                    moved.cancel()
                    lead.result()  # raises what ended it, if anything did
                    log.info("the job is over: the final epoch is committed")
                    return 0
                lead.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lead
                log.info("run %d is over (global recovery to run %d)", run, moved.result())
        except Fenced as fenced:
            log.error("%s: stepping down", fenced)
            return 1

    async def _run_changed(self, run: int) -> int:
        """The current run, once it differs from `run` (and is past 0)."""
        while True:
            with contextlib.suppress(StoreUnavailable):
                current = await self.registry.current_run()
                if current not in (0, run):
                    return current
            await asyncio.sleep(RETRY)

    async def _lead_run(self, leadership: Leadership, run: int, session: aiohttp.ClientSession) -> None:
        """Drive run `run`'s epochs until the final one is committed (or idle at a stop savepoint)."""
        point = await self._restore_point(leadership, run)
        if point is None:
            return  # refused: the tasks learn it from the run's restore point and exit
        if point.finished:
            log.info("job already finished at epoch %d: its tasks recover their sinks and exit", point.epoch)
            return
        entries = await self.epoch_log.entries()
        last = entries[-1] if entries else None
        if (
            last is not None
            and last.state is EpochState.COMMITTED
            and last.detail.get("kind") == "final"
            and last.detail.get("run") == run
        ):
            return  # a standby that won after the end
        tasks = await self._registered(run)
        fence = {"run": run, "token": leadership.token}

        async def post(task_id: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
            while True:
                try:
                    async with session.request(
                        "GET" if path == "/control/status" else "POST", f"{tasks[task_id]}{path}", json=body
                    ) as resp:
                        if resp.status == 409:
                            raise Fenced(f"task {task_id} refused {path}: {await resp.text()}")
                        resp.raise_for_status()
                        answer: dict[str, Any] = await resp.json()
                        return answer
                except (aiohttp.ClientError, TimeoutError) as exc:
                    log.info("task %s unreachable for %s (%s); retrying", task_id, path, exc)
                    await asyncio.sleep(RETRY)

        sources = self.plan.source_task_ids()

        async def trigger(epoch: int, kind: str) -> None:
            body = {"epoch": epoch, "kind": kind, **fence}
            await asyncio.gather(*(post(t, "/control/barrier", body) for t in sources))

        async def notify(epoch: int) -> None:
            await asyncio.gather(*(post(t, "/control/commit", {"epoch": epoch, **fence}) for t in tasks))

        statuses = dict(
            zip(tasks, await asyncio.gather(*(post(t, "/control/status", {}) for t in tasks)), strict=True)
        )
        cp = self.deployment.checkpoint
        coordinator = EpochCoordinator(
            self.plan,
            self.storage,
            self.epoch_log,
            leadership,
            settings=CoordinatorSettings(cp.interval_ms, cp.timeout_ms, cp.retain_latest),
            trigger=trigger,
            notify=notify,
            first_epoch=max(point.next_epoch, (last.epoch if last else 0) + 1),
            restored=point.epoch,
            run=run,
        )
        for task_id, status in statuses.items():
            if status["sourceFinished"]:
                coordinator.source_finished(task_id)
        await self._settle_log(coordinator, last, run, statuses, notify)
        self.current, self.leading_run = coordinator, run
        try:
            if not _stopped_at(last, run):
                await coordinator.run()
        finally:
            self.current = None
            await coordinator.settle()
        if coordinator.stopped or _stopped_at(last, run):
            log.info("run %d stands at a stop savepoint: no more epochs until the run changes", run)
            await asyncio.Event().wait()  # the run watcher ends this

    async def _restore_point(self, leadership: Leadership, run: int) -> RestorePoint | None:
        """The run's restore point: chosen once per run from storage (`checkpoint.restore`), then read back.

        The operator or `nopstream run --etcd` may have left a request there first: the
        plan a stop savepoint was taken with (`fromPlan`: an upgrade or rescale), or a new
        lineage (`restartNonce`, with a `base` epoch for `--restore-from`). A refusal
        is recorded in its place (tasks exit with it) and None returned.
        """
        key = self.layout.restore(run)
        entry = await self.backend.get(key)
        request: dict[str, Any] = json.loads(entry.value) if entry is not None else {}
        if "refused" in request:
            return None
        if "nextEpoch" in request:
            return RestorePoint.from_json(entry.value if entry is not None else b"")
        entries = await self.epoch_log.entries()
        log_latest = await self.epoch_log.latest_durable()
        if log_latest is not None and await asyncio.to_thread(self._storage_is_empty):
            # Storage is the truth: the namespace was deleted, so the log describes a job
            # that no longer exists. Fenced, so only this leader replaces it.
            reason = f"checkpoint namespace {self.plan.identity.checkpoint_namespace} is empty in storage"
            log.warning("the epoch log names durable epoch %d but %s: replacing it", log_latest, reason)
            await self.epoch_log.disown_latest(leadership, reason)
            log_latest = None
        fresh = request.get("restartNonce")
        base = request.get("base")
        try:
            point = await asyncio.to_thread(
                restore.choose,
                self.storage,
                self.plan,
                new_lineage=NewLineage(str(fresh), None if base is None else int(base)) if fresh else None,
                from_plan=request.get("fromPlan"),
                log_latest=log_latest,
                log_highest=max((e.epoch for e in entries), default=0),
            )
        except RestoreRefused as refused:
            log.error("run %d cannot start: %s", run, refused)
            await leadership.write({key: json.dumps({"refused": str(refused)}).encode()})
            return None
        await leadership.write({key: point.to_json()})
        log.info("run %d restores %s", run, point)
        return point

    def _storage_is_empty(self) -> bool:
        return catalog.highest_epoch(self.storage, self.plan.identity.checkpoint_namespace) is None

    async def _registered(self, run: int) -> dict[str, str]:
        """Each task's endpoint, once every task of the run has registered."""
        expected = set(self.plan.task_ids())
        while True:
            with contextlib.suppress(StoreUnavailable):
                found = await self.registry.tasks(run)
                if expected <= set(found):
                    return {t: found[t].endpoint for t in sorted(expected)}
            await asyncio.sleep(RETRY)

    async def _settle_log(
        self,
        coordinator: EpochCoordinator,
        last: EpochEntry | None,
        run: int,
        statuses: dict[str, dict[str, Any]],
        notify: Any,
    ) -> None:
        """Finish what a predecessor left: commit a DURABLE epoch, adopt or abort one in flight."""
        if last is None:
            return
        same_run = last.detail.get("run") == run
        kind = str(last.detail.get("kind", "checkpoint"))
        if last.state is EpochState.DURABLE:
            if same_run:  # tasks of another run re-committed it when they restored
                await notify(last.epoch)
            await self.epoch_log.record(
                coordinator.leadership,
                last.epoch,
                EpochState.COMMITTED,
                kind=kind,
                run=last.detail.get("run"),
            )
        elif last.state is EpochState.CREATED and same_run:
            acks: dict[str, Ack] = {
                t: ack_of(s["ack"])
                for t, s in statuses.items()
                if s["ack"] is not None and int(s["ack"]["epoch"]) == last.epoch
            }
            log.info("adopting epoch %d in flight (%d ACKs already taken)", last.epoch, len(acks))
            coordinator.adopt(last.epoch, kind, acks)
        elif last.state is EpochState.CREATED:
            await self.epoch_log.record(
                coordinator.leadership, last.epoch, EpochState.ABORTED, reason=f"run changed to {run}"
            )

    async def _for_current_run(
        self, request: web.Request, *required: str
    ) -> tuple[EpochCoordinator, str, dict[str, Any]]:
        """The coordinator of the run a task's message is for, the task and the body (400, 404, 409, 503)."""
        body = await guard.json_body(request, "taskId", "run", *required)
        run = guard.int_field(body, "run")
        current = self.current
        if current is None:
            raise web.HTTPServiceUnavailable(text="not leading a run yet")
        if run != self.leading_run:
            raise web.HTTPConflict(text=f"run {run} is over: this coordinator leads run {self.leading_run}")
        task_id = body["taskId"]
        if task_id not in self.plan.task_ids():
            raise web.HTTPNotFound(text=f"unknown task {task_id!r}")
        return current, task_id, body

    async def _ack(self, request: web.Request) -> web.Response:
        current, task_id, body = await self._for_current_run(request, "epoch", "segments")
        current.ack(task_id, guard.int_field(body, "epoch"), ack_of(body))
        return web.json_response({"ok": True})

    async def _source_finished(self, request: web.Request) -> web.Response:
        current, task_id, _ = await self._for_current_run(request)
        current.source_finished(task_id)
        return web.json_response({"ok": True})

    async def _savepoint(self, request: web.Request) -> web.Response:
        current = self.current
        if current is None:
            raise web.HTTPServiceUnavailable(text="not leading a run")
        current.request_savepoint(stop=request.query.get("stop") == "true")
        return web.json_response({"requested": True, "savepoints": current.savepoints})

    async def _metrics(self, request: web.Request) -> web.Response:
        registry = CollectorRegistry()
        if self.current is not None:
            registry.register(CoordinatorCollector(self.current, recoveries=max(0, self.leading_run - 1)))
        registry.register(guard.GuardCollector(self.guard))
        return web.Response(body=exposition(registry), content_type="text/plain")

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})


async def _reachable(backend: EtcdBackend) -> None:
    """Return once etcd answers: a candidate started while it is down waits instead of dying."""
    while True:
        try:
            await backend.revision()
            return
        except StoreUnavailable:
            log.info("etcd is unreachable; waiting for it before campaigning")
            await asyncio.sleep(RETRY * 2)


def _stopped_at(last: EpochEntry | None, run: int) -> bool:
    """Whether the run already stopped at a savepoint (durable or committed)."""
    return (
        last is not None
        and last.detail.get("kind") == "stop"
        and last.state in (EpochState.DURABLE, EpochState.COMMITTED)
        and last.detail.get("run") == run
    )


async def serve(settings: NodeSettings) -> int:
    """Run one coordinator candidate; its exit code."""
    plan = load_plan(settings.partitioned_path)
    deployment = load_deployment(settings.deployment_path)
    return await CoordinatorProcess(settings, plan, deployment).serve()
