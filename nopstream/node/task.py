"""A task pod's process (`nopstream task`): one task of one run, coordinated through etcd.

It lives the life of every task process (`node.tasklife`), with etcd as its directory:
it serves its channels and commands (`node.wire.taskserver`), registers under its run
with its endpoint bound to its own lease, waits for the run's restore point (chosen
by the coordinator), restores, connects its outputs (peers found in the registry),
runs, and exits 0 once the final epoch is committed. ACKs and source-finished go to
whichever coordinator leads, retried through a failover (`node.wire.coordinator_api`). When
its lease is lost the process exits non-zero (crash-only): its pod's failure, or the
report its pod's next task process writes (`node.resident`), triggers the global recovery.

A task process of a pod (NOPSTREAM_RESIDENT, forked by `node.resident`) first waits for
the next run its pod serves (`Registry.next_to_serve`), its port answering the probes:
the run it was made for, or a later one a recovery handed it, keeping its pod. It ends
the moment its run moves on (`resident.run_over`). A standby task (NOPSTREAM_STANDBY) is
such a process made before its run begins, so that a recovery need not wait for a
process to start; it serves only a run a recovery handed it, and otherwise exits 0
without registering.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any

from nopstream import errors, stacks
from nopstream.checkpoint.restore import RestorePoint
from nopstream.cluster.backend import Backend, StoreUnavailable, wait_reachable
from nopstream.cluster.election import Election
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.leases import ThreadedLeaseKeeper
from nopstream.cluster.registry import Registration, Registry
from nopstream.errors import RestoreRefused
from nopstream.node import recovery, resident, tasklife
from nopstream.node.settings import NodeSettings
from nopstream.node.wire.coordinator_api import CoordinatorLink
from nopstream.node.wire.messages import TaskIdentity
from nopstream.node.wire.tls import client_session
from nopstream.plan import compiler
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.runtime.background import run_until
from nopstream.runtime.task import Task

log = logging.getLogger(__name__)
POLL = 0.05
REPORT_SECONDS = 2.0  # a report to a coordinator that does not answer is given up, not waited for
TEARDOWN_S = 10.0  # from the final commit to the end of the process, at most


class LeaseLost(RuntimeError):
    """This process's lease is gone: it must stop acting."""


async def poll_key(backend: Backend, key: str) -> bytes:
    """The value of `key` once it exists (etcd may be briefly unreachable meanwhile)."""
    while True:
        with contextlib.suppress(StoreUnavailable):
            entry = await backend.get(key)
            if entry is not None:
                return entry.value
        await asyncio.sleep(POLL)


async def serve(settings: NodeSettings, start: resident.Start | None = None) -> None:
    """Run one task of one run to completion; LeaseLost when its lease goes.

    A pod's process (resident or standby) serves the next run its pod serves after
    `start.after`, once there is one, having reported its predecessor's failure; it ends
    with `resident.run_over` when that run moves on.
    """
    assert settings.task_id is not None and settings.run is not None
    plan = compiler.read_document(settings.partitioned_path, PartitionedPlan)
    deployment = compiler.read_document(settings.deployment_path, DeploymentPlan)
    backend = EtcdBackend(settings.etcd_host, settings.etcd_port, access=settings.etcd_access)
    layout = Layout(deployment.namespace, plan.identity.job_id, plan.identity.pipeline_id)
    registry, start = Registry(backend, layout), start or resident.Start()
    try:
        await wait_reachable(backend)  # a start on a busy node or during an etcd outage waits
        run = await _the_run(settings, registry, start)
        if run is None:
            log.info("task %s (%s) is not needed: a run began without it", settings.task_id, settings.attempt)
            return
        start.began(run)
        who = TaskIdentity(settings.task_id, run, settings.attempt)
        if settings.resident:
            _end_with_the_run(settings, layout, run)
        async with (
            ThreadedLeaseKeeper(
                lambda: EtcdBackend(settings.etcd_host, settings.etcd_port, access=settings.etcd_access),
                settings.lease_ttl,
            ) as keeper,
            client_session(settings.secret, settings.tls) as session,
        ):
            link = CoordinatorLink(session, Election(backend, layout, who.attempt).leader_endpoint, who)
            directory = _Registry(backend, layout, who, keeper, link)
            bind = (settings.host, settings.port, settings.advertise)
            life = tasklife.live(
                plan,
                deployment,
                who,
                directory,
                link,
                session=session,
                secret=settings.secret,
                bind=bind,
                tls=settings.tls,
            )
            await _until_lease_lost(keeper, life)
    finally:
        await backend.close()


async def _the_run(settings: NodeSettings, registry: Registry, start: resident.Start) -> int | None:
    """The run this process serves: its own, or for a pod's process (`resident`, standby) the next its
    pod serves, waited for after its predecessor's failure is reported (None: it is not needed)."""
    assert settings.task_id is not None and settings.run is not None
    if not (settings.resident or settings.standby):
        return settings.run
    if start.failed is not None:
        await registry.report_failed(start.after, settings.task_id, settings.attempt, start.failed)
    return await _stand_by(settings, registry, start.after)


class _Registry:
    """`tasklife.Directory` over the job's etcd registry, the run's restore point there and whichever
    coordinator leads."""

    def __init__(
        self,
        backend: Backend,
        layout: Layout,
        who: TaskIdentity,
        keeper: ThreadedLeaseKeeper,
        link: CoordinatorLink,
    ) -> None:
        self.backend = backend
        self.layout = layout
        self.who = who
        self.keeper = keeper
        self.link = link

    async def resolve(self, task_id: str) -> str:
        value = await poll_key(self.backend, self.layout.task(self.who.run, task_id))
        endpoint: str = json.loads(value)["endpoint"]
        return endpoint

    async def register(self, endpoint: str) -> None:
        registration = Registration(self.who.task_id, self.who.attempt, endpoint)
        await Registry(self.backend, self.layout).register(
            self.who.run, registration, lease=self.keeper.lease
        )

    async def restore_point(self) -> RestorePoint:
        return await restore_point(self.backend, self.layout, self.who.run)

    async def report(self, path: str, body: dict[str, Any]) -> None:
        # a report to a coordinator that does not answer is given up, not waited for
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REPORT_SECONDS):
                await self.link.post_now(path, body)

    async def failed(self, error: Exception, *, restoring: bool) -> None:
        if restoring and isinstance(error, RestoreRefused):
            recovery.exit_refused(error)  # at once: see exit_refused
        # shown on the dashboard; the pod's failure is what recovers the job (a bad record: the
        # pod exits with its refusal's code)
        await self.report("/failed", errors.failure_report(error))

    async def finished(self, task: Task, link: CoordinatorLink) -> None:
        # Every task stays until the final epoch is committed, so a coordinator that takes
        # over at the very end can still ask each of them for its last ACK.
        await task.final_committed()
        _exit_if_teardown_hangs(self.who.task_id)


async def _stand_by(settings: NodeSettings, registry: Registry, after: int) -> int | None:
    """Wait, imported and loaded, for the next run this process serves after `after` (None: a run
    began without it).

    The task port accepts (and closes) connections meanwhile, so the pod's TCP probes
    pass while it waits; the task's own server takes the port over after.
    """
    assert settings.task_id is not None and settings.run is not None
    probes = await asyncio.start_server(_close, settings.host, settings.port)
    waits_for = max(settings.run, after + 1)
    log.info("task %s (%s) stands by for run %d or later", settings.task_id, settings.attempt, waits_for)
    try:
        return await registry.next_to_serve(
            settings.task_id, settings.attempt, made_for=settings.run, standby=settings.standby, after=after
        )
    finally:
        probes.close()
        await probes.wait_closed()


def _end_with_the_run(settings: NodeSettings, layout: Layout, run: int) -> None:
    """End this process the moment the current run is past `run` (`resident.run_over`), watched from a
    thread, event loop and etcd client of its own: a user function that holds the task's event
    loop must not hold the next run up."""

    async def watch() -> None:
        backend = EtcdBackend(settings.etcd_host, settings.etcd_port, access=settings.etcd_access)
        resident.run_over(run, await Registry(backend, layout).run_past(run))

    threading.Thread(target=lambda: asyncio.run(watch()), name="run watch", daemon=True).start()


async def _close(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def restore_point(backend: Backend, layout: Layout, run: int) -> RestorePoint:
    """The run's restore point once its coordinator has chosen it; RestoreRefused when it refused."""
    return RestorePoint.from_json(await poll_key(backend, layout.restore(run)))


def _exit_if_teardown_hangs(task_id: str) -> None:
    """The work is committed: a teardown that hangs (a client that does not close) must not keep
    the process, and its pod, alive. After TEARDOWN_S it says where it hung and exits 0."""
    loop = asyncio.get_running_loop()

    def expire() -> None:
        log.error("task %s: teardown not done %.0fs after the final commit: exiting", task_id, TEARDOWN_S)
        stacks.dump(loop)
        os._exit(0)

    timer = threading.Timer(TEARDOWN_S, expire)
    timer.daemon = True
    timer.start()


async def _until_lease_lost(keeper: ThreadedLeaseKeeper, work: Coroutine[Any, Any, None]) -> None:
    """Run `work`; LeaseLost (and `work` cancelled) if the lease is lost first."""
    running = await run_until(work, keeper.lost)
    if keeper.lost.is_set() and running.cancelled():
        raise LeaseLost(f"lease {keeper.lease:x} lost: this process stops acting")
    running.result()
