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

HTTP: the coordinator's routes (`node.wire.coordinator_api`, the dashboard among them) and
GET /healthz; all but /metrics, /healthz and the dashboard's files need the job's
secret (`node.wire.guard`), and when the job speaks TLS (`node.wire.tls`) all but the
dashboard's API and a savepoint need the job's certificate too. The dashboard's history
begins when this process first leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import web

from nopstream.checkpoint import catalog, restore
from nopstream.checkpoint.epochs import Ack, EpochCoordinator
from nopstream.checkpoint.restore import RestorePoint, RestoreRequest
from nopstream.checkpoint.storage import Storage
from nopstream.cluster.backend import StoreUnavailable, wait_reachable
from nopstream.cluster.election import Election, Leadership
from nopstream.cluster.epochlog import EpochEntry, EpochLog
from nopstream.cluster.errors import Fenced
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.leases import LeaseKeeper
from nopstream.cluster.registry import Registry
from nopstream.errors import RestoreRefused
from nopstream.node import checkpointing
from nopstream.node.leading import Commands, Leader, lead_run
from nopstream.node.settings import NodeSettings
from nopstream.node.view.jobview import JobHistory
from nopstream.node.wire import guard
from nopstream.node.wire.coordinator_api import CoordinatorRoutes, Endpoint, TaskCommands
from nopstream.node.wire.messages import TaskStatus
from nopstream.node.wire.tls import client_session, scheme, server_context
from nopstream.plan import compiler
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.epochs import EpochKind, EpochState
from nopstream.plan.partitioned import PartitionedPlan

log = logging.getLogger(__name__)
RETRY = 0.2
REGISTERED_POLL = 0.05  # the last task's registration starts the run's first epoch: seen soon


class CoordinatorProcess:
    """One coordinator candidate of one job."""

    def __init__(self, settings: NodeSettings, plan: PartitionedPlan, deployment: DeploymentPlan) -> None:
        """A candidate named by the settings' attempt."""
        self.settings = settings
        self.plan = plan
        self.deployment = deployment
        self.backend = EtcdBackend(settings.etcd_host, settings.etcd_port, access=settings.etcd_access)
        self.layout = Layout(deployment.namespace, plan.identity.job_id, plan.identity.pipeline_id)
        self.registry = Registry(self.backend, self.layout)
        self.epoch_log = EpochLog(self.backend, self.layout)
        self.storage: Storage = checkpointing.open_storage(deployment)
        self.guard = guard.Guard(settings.secret, certificates=settings.tls is not None)
        self.history = JobHistory(plan)  # what the dashboard shows, since this process began to lead
        self.routes = CoordinatorRoutes(plan.task_ids(), self.guard, self.history)
        self.app = self.guard.application()
        self.routes.add_to(self.app)

    async def serve(self) -> int:
        """Serve, campaign, lead until the job is over (0) or the lease is lost (1)."""
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        tls = self.settings.tls
        site = web.TCPSite(runner, self.settings.host, self.settings.port, ssl_context=server_context(tls))
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        endpoint = f"{scheme(tls)}://{self.settings.advertise}:{port}"
        try:
            await wait_reachable(self.backend)  # before campaigning
            async with (
                LeaseKeeper(self.backend, self.settings.lease_ttl) as keeper,
                client_session(self.settings.secret, tls) as session,
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
                    self.routes.state = "finished"
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
        self.history.run_started(run, point.epoch, "start" if run == 1 else "global recovery")
        if point.finished:
            self.routes.state = "finished"
            log.info("job already finished at epoch %d: its tasks recover their sinks and exit", point.epoch)
            return
        entries = await self.epoch_log.entries()
        last = entries[-1] if entries else None
        if (
            last is not None
            and last.state is EpochState.COMMITTED
            and last.kind == EpochKind.FINAL
            and last.run == run
        ):
            return  # a standby that won after the end
        tasks = await self._registered(run)
        commands = TaskCommands(
            session,
            _found(tasks),
            sources=self.plan.source_task_ids(),
            tasks=tuple(tasks),
            run=run,
            token=leadership.token,
        )
        statuses = await commands.status()
        leader = Leader(
            self.plan, self.deployment.checkpoint, self.storage, self.epoch_log, leadership, self.history
        )
        coordinator = leader.coordinator(
            run, point, commands, first_epoch=max(point.next_epoch, (last.epoch if last else 0) + 1)
        )
        for task_id, status in statuses.items():
            if status.source_finished:
                coordinator.source_finished(task_id)
        await self._settle_log(coordinator, last, run, statuses, commands)
        await lead_run(coordinator, routes=self.routes, idle=_stopped_at(last, run))
        if coordinator.stopped or _stopped_at(last, run):
            log.info("run %d stands at a stop savepoint: no more epochs until the run changes", run)
            await asyncio.Event().wait()  # the run watcher ends this

    async def _restore_point(self, leadership: Leadership, run: int) -> RestorePoint | None:
        """The run's restore point: chosen once per run from storage (`checkpoint.restore`), then read back.

        The operator or `nopstream run --etcd` may have asked for a new lineage or an
        upgrade's plan first (`RestoreRequest`). A refusal is recorded in the point's
        place (tasks exit with it) and None returned.
        """
        key = self.layout.restore(run)
        entry = await self.backend.get(key)
        if entry is not None:
            try:
                return RestorePoint.from_json(entry.value)
            except RestoreRefused:
                return None
        asked = await self.backend.get(self.layout.restore_request(run))
        request = RestoreRequest.from_json(asked.value) if asked is not None else RestoreRequest()
        entries = await self.epoch_log.entries()
        log_latest = await self.epoch_log.latest_durable()
        # one listing serves the check below and the choice of the point
        stored = await asyncio.to_thread(
            catalog.Stored.read, self.storage, self.plan.identity.checkpoint_namespace
        )
        if log_latest is not None and stored.highest() is None:
            # Storage is the truth: the namespace was deleted, so the log describes a job
            # that no longer exists. Fenced, so only this leader replaces it.
            reason = f"checkpoint namespace {self.plan.identity.checkpoint_namespace} is empty in storage"
            log.warning("the epoch log names durable epoch %d but %s: replacing it", log_latest, reason)
            await self.epoch_log.disown_latest(leadership, reason)
            log_latest = None
        try:
            point = await asyncio.to_thread(
                restore.choose,
                self.storage,
                self.plan,
                new_lineage=request.new_lineage,
                from_plan=request.from_plan,
                log_latest=log_latest,
                log_highest=max((e.epoch for e in entries), default=0),
                stored=stored,
            )
        except RestoreRefused as refused:
            log.error("run %d cannot start: %s", run, refused)
            await leadership.write({key: RestorePoint.refusal_json(str(refused))})
            return None
        await leadership.write({key: point.to_json()})
        log.info("run %d restores %s", run, point)
        return point

    async def _registered(self, run: int) -> dict[str, str]:
        """Each task's endpoint, once every task of the run has registered."""
        expected = set(self.plan.task_ids())
        while True:
            with contextlib.suppress(StoreUnavailable):
                found = await self.registry.tasks(run)
                if expected <= set(found):
                    return {t: found[t].endpoint for t in sorted(expected)}
            await asyncio.sleep(REGISTERED_POLL)

    async def _settle_log(
        self,
        coordinator: EpochCoordinator,
        last: EpochEntry | None,
        run: int,
        statuses: dict[str, TaskStatus],
        commands: Commands,
    ) -> None:
        """Finish what a predecessor left: commit a DURABLE epoch, adopt or abort one in flight."""
        if last is None:
            return
        same_run = last.run == run
        kind = last.kind
        if last.state is EpochState.DURABLE:
            if same_run:  # tasks of another run re-committed it when they restored
                await commands.commit(last.epoch)
            await coordinator.log.record(last.epoch, EpochState.COMMITTED, kind=kind, run=last.run)
        elif last.state is EpochState.CREATED and same_run:
            acks: dict[str, Ack] = {
                t: s.last_ack[1]
                for t, s in statuses.items()
                if s.last_ack is not None and s.last_ack[0] == last.epoch
            }
            log.info("adopting epoch %d in flight (%d ACKs already taken)", last.epoch, len(acks))
            coordinator.adopt(last.epoch, kind, acks)
        elif last.state is EpochState.CREATED:
            await coordinator.log.record(last.epoch, EpochState.ABORTED, reason=f"run changed to {run}")


def _found(endpoints: dict[str, str]) -> Endpoint:
    """The endpoint of each task, as registered."""

    async def endpoint(task_id: str) -> str:
        return endpoints[task_id]

    return endpoint


def _stopped_at(last: EpochEntry | None, run: int) -> bool:
    """Whether the run already stopped at a savepoint (durable or committed)."""
    return (
        last is not None
        and last.kind == EpochKind.STOP
        and last.state in (EpochState.DURABLE, EpochState.COMMITTED)
        and last.run == run
    )


async def serve(settings: NodeSettings) -> int:
    """Run one coordinator candidate; its exit code."""
    plan = compiler.read_document(settings.partitioned_path, PartitionedPlan)
    deployment = compiler.read_document(settings.deployment_path, DeploymentPlan)
    return await CoordinatorProcess(settings, plan, deployment).serve()
