"""The single-machine runner behind `nopstream run`: the embedded default.

Multi-process (the default): one OS process per task, talking over http channels on
loopback and reporting to a control server in this process. In-process
(`--in-process`): every task in this process over local queues. A bounded job ends
when every task has finished; the first task that fails stops the others and the
run fails with that task's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import aiohttp

from nopstream import faults, safefiles
from nopstream.checkpoint import plans as plans_store
from nopstream.checkpoint import restore
from nopstream.checkpoint.epochs import EpochCoordinator
from nopstream.checkpoint.restore import NewLineage, RestorePoint
from nopstream.checkpoint.storage import Storage
from nopstream.cluster.election import Election
from nopstream.cluster.epochlog import EpochLog
from nopstream.cluster.layout import Layout
from nopstream.cluster.leases import LeaseKeeper
from nopstream.cluster.local import LocalBackend
from nopstream.connectors import registry
from nopstream.errors import RestoreRefused, StorageError
from nopstream.local import children, inprocess, ownership, processes, worker
from nopstream.local.children import Child
from nopstream.local.control import ControlServer
from nopstream.local.progress import Progress
from nopstream.local.watch import TaskDied, kill_a_task, supervise
from nopstream.node import checkpointing, recovery
from nopstream.node.leading import Leader, lead_run
from nopstream.node.tasklife import task_settings
from nopstream.node.view.jobview import JobHistory
from nopstream.node.wire import guard
from nopstream.node.wire.coordinator_api import DASHBOARD_PATH, TaskCommands
from nopstream.plan import compiler
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.records import TaskSnapshot
from nopstream.runtime.task import Task


class JobFailed(RuntimeError):
    """A task of the job failed; the message names it and carries its error."""


class _ProcessSteps:
    """A recovery of `nopstream run`'s task processes (`node.recovery`).

    Runs are numbered by this command alone; a run's processes are stopped as its
    attempt ends, and the next attempt starts the new run's.
    """

    def __init__(self, options: RunOptions) -> None:
        self.quiet = options.quiet

    def advance(self, run: int) -> int:
        return run + 1

    def record(self, recovered: recovery.Recovery) -> None:
        if not self.quiet:
            print(f"recovering: {recovered.message}", file=sys.stderr)
        os.environ.pop(faults.ENV, None)  # fault points fire in the first run only

    def stop(self, run: int) -> None:
        """Nothing left: `_attempt` stopped the run's processes as it ended."""

    def start(self, run: int, *, delay_s: float) -> None:
        """Wait out the backoff; the next attempt starts the run's processes."""
        time.sleep(delay_s)


@dataclass(frozen=True)
class RunOptions:
    """How to run: in one process or many, where to keep run files, what to show."""

    in_process: bool = False
    quiet: bool = False
    workdir: Path = Path(".nopstream")
    python_path: tuple[str, ...] = ()
    progress: TextIO | None = None
    restore_from: int | None = None
    fresh: bool = False
    max_restarts: int = 10
    restart_backoff: float = recovery.RestartPolicy.backoff_s
    drop_state: tuple[str, ...] = ()
    """Operators whose state a changed job may leave behind (the model's `dropState`)."""

    @property
    def restart_policy(self) -> recovery.RestartPolicy:
        """The failure rate the job survives (`--max-restarts` within the policy's window) and its backoff
        (`--restart-backoff`)."""
        return recovery.RestartPolicy(max_failures=self.max_restarts, backoff_s=self.restart_backoff)

    def run_files(self, job_id: str) -> Path:
        """The directory of a job's run files (plans, logs, the secret) inside the private `{workdir}/runs`;
        UnsafePath when the work directory is another user's or `runs` is not private."""
        safefiles.trusted_dir(self.workdir, what="the work directory")
        runs = safefiles.private_dir(self.workdir / "runs", what="the run files directory")
        return runs / job_id


@dataclass(frozen=True)
class RunResult:
    """What a finished run reports."""

    seconds: float
    processing_seconds: float
    records_in: dict[str, int]
    records_out: dict[str, int]
    channels: dict[str, dict[str, int]]
    runs: int = 1
    finished_before: int | None = None  # the final epoch, when the job had finished in an earlier run
    resumed_from: int | None = None
    """The durable epoch the first run restored (None: it started from nothing)."""
    stopped_at: int | None = None
    """The stop savepoint the job stopped at (`nopstream savepoint --stop`), its output committed."""


def new_lineage(options: RunOptions) -> NewLineage | None:
    """The new lineage `--fresh` or `--restore-from` asks for (one nonce per command), or None."""
    if not options.fresh and options.restore_from is None:
        return None
    return NewLineage(uuid.uuid4().hex, base=options.restore_from)


def starting_point(
    storage: Storage, plans: compiler.CompiledPlans, options: RunOptions, lineage: NewLineage | None
) -> RestorePoint:
    """The first run's restore point, a changed plan's change checked (`checkpoint.plans`) and said; the
    plan is recorded beside its epochs."""
    plan = plans.partitioned
    point = restore.choose(storage, plan, new_lineage=lineage)
    verdict = plans_store.check_change(storage, plan, point, drop_state=options.drop_state)
    # a later run of a changed plan checks its change against the plan these epochs are taken with
    plans_store.record(storage, plan)
    if not options.quiet and verdict is not None:
        reasons = "; ".join(str(r) for r in verdict.reasons)
        print(
            f"job '{plan.identity.job_id}': {verdict.change.name} from savepoint epoch {point.epoch}:"
            f" {reasons}",
            file=sys.stderr,
        )
    elif not options.quiet and point.epoch is not None and not point.finished:
        print(f"job '{plan.identity.job_id}': resuming from epoch {point.epoch}", file=sys.stderr)
    return point


def run_job(plans: compiler.CompiledPlans, options: RunOptions) -> RunResult:
    """Run a compiled job to completion, holding its checkpoint namespace; JobFailed when a task fails."""
    for path in options.python_path:
        if path not in sys.path:
            sys.path.insert(0, path)
    options.run_files(plans.partitioned.identity.job_id)  # refused before anything starts
    storage = checkpointing.open_storage(plans.deployment)
    with ownership.hold(storage, plans.partitioned, holder="nopstream run"):
        if options.in_process:
            return asyncio.run(_run_in_process(plans, options, storage))
        return _run_processes(plans, options, storage)


class _InProcessListener:
    """Tasks of this process write their segments and ACK the coordinator directly."""

    def __init__(self, storage: Storage, coordinator: EpochCoordinator) -> None:
        self.storage = storage
        self.coordinator = coordinator

    async def on_snapshot(self, task: Task, epoch: int, kind: EpochKind, state: TaskSnapshot) -> None:
        ack = await checkpointing.write_snapshot_async(self.storage, task, epoch, state)
        self.coordinator.ack(task.task_id, epoch, ack)

    async def on_source_finished(self, task: Task) -> None:
        self.coordinator.source_finished(task.task_id)


async def _run_in_process(plans: compiler.CompiledPlans, options: RunOptions, storage: Storage) -> RunResult:
    started = time.monotonic()
    plan = plans.partitioned
    point = await asyncio.to_thread(starting_point, storage, plans, options, new_lineage(options))
    commands = inprocess.DirectCommands()
    async with _local_leader(plans, storage, "local-runner") as leader:
        coordinator = leader.coordinator(1, point, commands)
        listener = _InProcessListener(storage, coordinator)
        tasks = commands.tasks
        tasks.extend(inprocess.build_tasks(plan, listener=listener, settings=task_settings()))
        for t in tasks:
            await checkpointing.start_task(t, storage, point)
        processing_started = time.monotonic()
        progress = Progress(
            plan,
            lambda: {
                t.task_id: (t.metrics.records_in, t.metrics.records_out, t.metrics.watermark) for t in tasks
            },
            out=options.progress,
            quiet=options.quiet,
        )
        ticker = asyncio.create_task(progress.loop(), name="progress")
        try:
            await lead_run(coordinator, work=inprocess.run_tasks(tasks))
        except* inprocess.TaskFailed as failures:
            raise JobFailed(str(failures.exceptions[0])) from failures.exceptions[0]
        except* RestoreRefused as refused:  # a bad record: not retried, its own line
            raise refused.exceptions[0] from None
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            progress.done()
    counts = {t.task_id: (t.metrics.records_in, t.metrics.records_out) for t in tasks}
    channels = [t.channel_stats() for t in tasks]
    result = _result(plan, started, time.monotonic() - processing_started, counts, channels)
    return _ended(result, point, coordinator)


@contextlib.asynccontextmanager
async def _local_leader(
    plans: compiler.CompiledPlans, storage: Storage, candidate: str, history: JobHistory | None = None
) -> AsyncIterator[Leader]:
    """The job's leader on this machine: the leadership of an election in this process, won at once."""
    plan = plans.partitioned
    backend = LocalBackend()
    layout = Layout("local", plan.identity.job_id, plan.identity.pipeline_id)
    try:
        async with LeaseKeeper(backend, 30) as keeper:
            leadership = await Election(backend, layout, candidate).campaign(keeper)
            epoch_log = EpochLog(backend, layout)
            yield Leader(plan, plans.deployment.checkpoint, storage, epoch_log, leadership, history)
    finally:
        await backend.close()


def _run_processes(plans: compiler.CompiledPlans, options: RunOptions, storage: Storage) -> RunResult:
    """Run in task processes; when a task dies, recover globally from the latest durable epoch.

    One control socket serves every run of the command, so the dashboard's address
    (printed at the start) stays the same through recoveries; its history spans them.
    """
    started = time.monotonic()
    plan = plans.partitioned
    keep_last_command(options.run_files(plan.identity.job_id))
    lineage = new_lineage(options)  # started by the first run; its recoveries find it started
    secret = guard.new_secret()  # one per command: every run of it is fenced by its number
    history = JobHistory(plan)
    run, recoveries, cause = 1, 0, "start"
    failures: tuple[float, ...] = ()
    with socket.create_server(("127.0.0.1", 0)) as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        if not options.quiet:
            print(f"dashboard: {url}{DASHBOARD_PATH}#token={secret}", file=sys.stderr)
        first = point = starting_point(storage, plans, options, lineage)
        while True:
            history.run_started(run, point.epoch, cause)
            try:
                control, coordinator = _attempt(plans, options, _Run(run, point, secret, sock, url, history))
            except TaskDied as death:
                try:
                    recovered = recovery.recover(
                        _ProcessSteps(options),
                        run=run,
                        recoveries=recoveries,
                        failures=failures,
                        now=time.monotonic(),
                        policy=options.restart_policy,
                        cause=death.short,
                    )
                except recovery.TooManyRecoveries as failed:
                    raise JobFailed(f"{failed}:\n{death.detail}") from death
                run, recoveries, cause = recovered.run, recovered.recoveries, death.short
                failures = recovered.failures
                point = restore.choose(storage, plan, new_lineage=lineage)
                continue
            stats = {t: history.tasks[t].stats for t in control.tasks if t in history.tasks}
            counts = {t: (s.records_in, s.records_out) for t, s in stats.items()}
            channels = [s.channels for s in stats.values()]
            result = _result(plan, started, control.processing_seconds(), counts, channels, runs=run)
            return _ended(result, first, coordinator)


LAST_COMMAND = "previous"
"""Where a command keeps the run directories (plans, task logs) of the job's command before it."""


def keep_last_command(job_dir: Path) -> None:
    """Move the run directories of the job's previous command into `previous/` (replacing the ones before
    them), so that this command's runs, numbered from 1 again, never overwrite the last command's logs.

    Called holding the job's checkpoint namespace: no other command of the job runs.
    """
    earlier = sorted(job_dir.glob("run-*"))
    if not earlier:
        return
    previous = job_dir / LAST_COMMAND
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir()
    for run_dir in earlier:
        run_dir.rename(previous / run_dir.name)


@dataclass(frozen=True)
class _Run:
    """One run of the command's task processes: its number, restore point, and what every run shares."""

    run: int
    point: RestorePoint
    secret: str = dataclasses.field(repr=False)
    sock: socket.socket
    url: str
    history: JobHistory


def _attempt(
    plans: compiler.CompiledPlans, options: RunOptions, this: _Run
) -> tuple[ControlServer, EpochCoordinator]:
    """One run: fork every task (started from the restore point), coordinate epochs, supervise."""
    plan, run = plans.partitioned, this.run
    run_dir = options.run_files(plan.identity.job_id) / f"run-{run}"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(compiler.dump_document(plan))
    (run_dir / "deployment.json").write_text(compiler.dump_document(plans.deployment))
    # The tasks take the plans as every runner's tasks do, rebuilt from their documents (a record's
    # fields in the canonical order), read once here for all of them: 40 ms of each task's start before.
    for_tasks = compiler.read_document(run_dir / "plan.json", PartitionedPlan)
    deployment = compiler.read_document(run_dir / "deployment.json", DeploymentPlan)
    registry.preload(plan.operators().values())  # imported once here, not once in every task process
    # The control socket listens before the tasks are forked (they may call it at once);
    # the children close their copy.
    guard.write_secret(run_dir / "secret", this.secret)  # for `nopstream savepoint` and `status`
    (run_dir / "control-url").write_text(this.url)  # where the coordinator's routes are
    procs = [
        processes.fork_task(
            worker.WorkerSettings(
                plan=for_tasks,
                deployment=deployment,
                task_id=task_id,
                control_url=this.url,
                run=run,
                attempt=f"r{run}-a{i}",
                secret=this.secret,
                restore=this.point,
            ),
            run_dir / "logs" / f"{task_id.replace('/', '_')}.log",
            close_fds=(this.sock.fileno(),),
        )
        for i, task_id in enumerate(plan.task_ids())
    ]
    try:
        return asyncio.run(_control_run(plans, options, this, procs))
    finally:
        children.stop_all(procs)
        (run_dir / "control-url").unlink(missing_ok=True)  # `nopstream savepoint` finds live runs only
        (run_dir / "secret").unlink(missing_ok=True)


async def _control_run(
    plans: compiler.CompiledPlans, options: RunOptions, this: _Run, procs: list[Child]
) -> tuple[ControlServer, EpochCoordinator]:
    plan, run, secret = plans.partitioned, this.run, this.secret
    control = ControlServer(list(plan.task_ids()), run=run, guard=guard.Guard(secret), history=this.history)
    await control.start(this.sock.dup())  # the run's server closes its copy; the next run serves the socket
    storage = checkpointing.open_storage(plans.deployment)
    progress = Progress(
        plan,
        lambda: {
            t: (s.stats.records_in, s.stats.records_out, s.stats.watermark)
            for t, s in this.history.tasks.items()
        },
        out=options.progress,
        quiet=options.quiet,
    )
    ticker = asyncio.create_task(progress.loop(), name="progress")
    try:
        async with (
            aiohttp.ClientSession(headers=guard.headers(secret)) as session,
            _local_leader(plans, storage, f"local-runner-r{run}", this.history) as leader,
        ):
            commands = TaskCommands(
                session,
                control.endpoint,
                sources=plan.source_task_ids(),
                tasks=plan.task_ids(),
                run=run,
                token=leader.leadership.token,
                finished=lambda t: control.tasks[t].done,  # its process exits: its sinks committed
            )
            coordinator = leader.coordinator(run, this.point, commands)
            coordinator.on_fault = lambda: kill_a_task(procs)
            await lead_run(coordinator, routes=control.routes, work=supervise(procs, control))
    except BaseExceptionGroup as group:
        raise _run_failure(group) from None
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        progress.done()
        await control.stop()
    return control, coordinator


def _ended(result: RunResult, first: RestorePoint, coordinator: EpochCoordinator) -> RunResult:
    """A run's result with where it began and how it ended."""
    return dataclasses.replace(
        result,
        finished_before=first.epoch if first.finished else None,
        resumed_from=first.epoch,
        stopped_at=coordinator.savepoints[-1] if coordinator.stopped else None,
    )


def _run_failure(group: BaseExceptionGroup) -> BaseException:
    """The one failure a run reports for what its task group raised."""
    deaths = group.subgroup((RestoreRefused, TaskDied, JobFailed))
    if deaths is not None:
        return deaths.exceptions[0]
    storage = group.subgroup(StorageError)
    if storage is not None:  # the coordinator cannot write checkpoints: no recovery would
        return JobFailed(f"the coordinator cannot write checkpoints: {storage.exceptions[0]}")
    broken = group.subgroup((aiohttp.ClientError, ConnectionError))
    if broken is not None:
        first = broken.exceptions[0]
        return TaskDied("a task stopped answering", repr(first))
    return group


def _result(
    plan: PartitionedPlan,
    started: float,
    processing: float,
    counts: dict[str, tuple[int, int]],
    task_channels: list[dict[str, dict[str, int]]],
    *,
    runs: int = 1,
) -> RunResult:
    """Totals per vertex, and each channel's figures merged from both of its ends."""
    channels: dict[str, dict[str, int]] = {}
    for stats_of_task in task_channels:
        for cid, stats in stats_of_task.items():
            channels.setdefault(cid, {}).update(stats)
    per_in: dict[str, int] = {}
    per_out: dict[str, int] = {}
    for v in plan.vertices:
        per_in[v.vertex_id] = sum(counts.get(s.task_id, (0, 0))[0] for s in v.subtasks)
        per_out[v.vertex_id] = sum(counts.get(s.task_id, (0, 0))[1] for s in v.subtasks)
    return RunResult(time.monotonic() - started, processing, per_in, per_out, channels, runs)
