"""`nopstream run --etcd HOST:PORT`: a job's processes as the pods run them, supervised as the operator does.

Two coordinator processes (`nopstream coordinator`; one leads through etcd) and one
process per task (`nopstream task`), configured by the same NOPSTREAM_* variables
as the pods, each forked ready-loaded by the command's zygote (`local.zygote`). When
a task process fails or dies, the supervisor does what the operator does: it advances
the run by compare-and-swap in etcd, stops every task of the old run and starts the
new run's, which restore from the run's restore point.
When a coordinator process dies another candidate is started in its place; the
standby takes over without a global recovery.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from nopstream import faults
from nopstream.checkpoint.restore import NewLineage, RestorePoint, RestoreRequest
from nopstream.cluster.backend import StoreUnavailable
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.etcd_access import access_from_env
from nopstream.cluster.layout import Layout
from nopstream.cluster.registry import Registry
from nopstream.connectors import registry as connector_registry
from nopstream.errors import REFUSED_EXITS, Refusal, StartRefused
from nopstream.local import ownership, zygote
from nopstream.local.children import Child, stop_all
from nopstream.local.etcd_calls import EtcdCalls
from nopstream.local.runner import JobFailed, RunOptions, RunResult, new_lineage, starting_point
from nopstream.node import checkpointing, recovery
from nopstream.node.settings import DEPLOYMENT_FILE, PARTITIONED_FILE, NodeEnv
from nopstream.node.wire import authority, guard, tls
from nopstream.plan import compiler
from nopstream.plan.deployment import resource_name

LEASE_TTL = 4
CANDIDATES = 2
_SETTLE = 0.5  # seconds a task death waits for a refusal of another task to show
RUN_CHECK_S = 1.0
"""How often the supervisor checks that etcd still holds the run (etcd may lose its data)."""
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)
_ROLES_MODULES = ("nopstream.node.process", "nopstream.node.task", "nopstream.node.coordinator")
"""What the zygote loads once for every process it forks."""


class Supervisor:
    """Starts and watches one job's processes on this machine."""

    def __init__(
        self, plans: compiler.CompiledPlans, options: RunOptions, etcd: str, *, wait_s: float
    ) -> None:
        """Run `plans` coordinated by the etcd server at `etcd` (host:port), waited for at most `wait_s`
        seconds at the start (exit 3 after)."""
        self.plans = plans
        self.options = options
        self.etcd = etcd
        self.wait_s = wait_s
        ident = plans.partitioned.identity
        self.layout = Layout(plans.deployment.namespace, ident.job_id, ident.pipeline_id)
        self.home = options.run_files(ident.job_id) / "cluster"
        self.plan_dir = self.home / "plans"
        self.secret_file = self.home / "secret"
        self.coordinators: list[Child] = []
        self.tasks: list[Child] = []
        self.started_candidates = 0
        self.lineage: NewLineage | None = None
        self.calls: EtcdCalls | None = None
        self.zygote: zygote.Zygote | None = None

    def run(self) -> RunResult:
        """Run the job to its end, holding its checkpoint namespace; JobFailed after too many failures."""
        storage = checkpointing.open_storage(self.plans.deployment)
        # forked before the first thread (the etcd client's) and before the namespace's lock is opened
        connector_registry.preload(
            self.plans.partitioned.operators().values()
        )  # loaded there once, as with `run`
        title = f"nopstream zygote {self.plans.partitioned.identity.job_id}"
        self.zygote = zygote.start(title, _ROLES_MODULES, self.home / "logs" / "zygote.log")
        try:
            with ownership.hold(storage, self.plans.partitioned, holder=f"nopstream run --etcd {self.etcd}"):
                self.calls = EtcdCalls(self.etcd, access_from_env())  # its processes inherit the variable
                try:
                    return self._run(self.calls)
                finally:
                    self.calls.close()
        finally:
            self.zygote.close()

    def _run(self, calls: EtcdCalls) -> RunResult:
        """Run the job to its end with the command's etcd client `calls` (also `self.calls`, for the
        recovery steps)."""
        started = time.monotonic()
        self.plan_dir.mkdir(parents=True, exist_ok=True)
        (self.plan_dir / PARTITIONED_FILE).write_text(compiler.dump_document(self.plans.partitioned))
        (self.plan_dir / DEPLOYMENT_FILE).write_text(compiler.dump_document(self.plans.deployment))
        guard.write_secret(self.secret_file, guard.new_secret())  # one per command, as with `run`
        authority.issue(self.plans.partitioned.identity.job_id).write(self.home)  # and its TLS, beside it
        try:  # from here on the secret and the key are removed however the command ends
            _reach(calls, self.wait_s, quiet=self.options.quiet)
            self.lineage = new_lineage(self.options)
            if self.lineage is None:  # where its coordinator will start (read only): a changed plan checked
                starting_point(
                    checkpointing.open_storage(self.plans.deployment), self.plans, self.options, None
                )
            run = _advance_run(calls, self.layout, None, self._request())
            recoveries, failures = 0, tuple[float, ...]()
            self.coordinators = [self._candidate() for _ in range(CANDIDATES)]
            self.tasks = self._start_tasks(run)
            checked = time.monotonic()
            while not self._finished():
                time.sleep(0.1)
                self._replace_dead_coordinators()
                failure = self._task_failure()
                if failure is None and time.monotonic() - checked >= RUN_CHECK_S:
                    checked, lost = time.monotonic(), _lost_run(calls, self.layout, run)
                    failure = None if lost is None else (lost, "")
                if failure is None:
                    continue
                cause, detail = failure
                try:
                    recovered = recovery.recover(
                        self,
                        run=run,
                        recoveries=recoveries,
                        failures=failures,
                        now=time.monotonic(),
                        policy=self.options.restart_policy,
                        cause=cause,
                    )
                except recovery.TooManyRecoveries as failed:
                    raise JobFailed(f"{failed}:\n{detail}" if detail else str(failed)) from None
                run, recoveries, failures = recovered.run, recovered.recoveries, recovered.failures
            _wait(self.coordinators, 15)
            entry = _retried(calls, lambda b: b.get(self.layout.restore(run)))
        finally:
            stop_all(self.tasks + self.coordinators)
            self.secret_file.unlink(missing_ok=True)  # `nopstream savepoint --etcd` finds live jobs only
            for name in tls.FILES:
                (self.home / name).unlink(missing_ok=True)
        seconds = time.monotonic() - started
        point = RestorePoint.from_json(entry.value) if entry is not None else None
        finished = point.epoch if point is not None and point.finished else None
        return RunResult(seconds, seconds, {}, {}, {}, runs=recoveries + 1, finished_before=finished)

    def _task_failure(self) -> tuple[str, str] | None:
        """(cause, the end of its log) of a task process that died, or None; a refusal raised as itself.

        A task that cannot start at all, or met a bad record, is the same in every run.
        """
        dead = self._dead_tasks()
        if not dead:
            return None
        if not any(code in REFUSED_EXITS for _, code in dead):
            # a task whose peer refused to start may die of it first: let the refusal show
            time.sleep(_SETTLE)
            dead = self._dead_tasks()
        child, code = next(((t, c) for t, c in dead if c in REFUSED_EXITS), dead[0])
        refusal = Refusal.from_exit(code, child.tail(1))
        if refusal is not None:
            raise refusal.error(f"task {child.name}: ")
        return f"task {child.name} exited with {code}", child.tail()

    # the steps of a recovery (`node.recovery`)

    def advance(self, run: int) -> int:
        """Move the run in etcd, asking the next run for this command's lineage in the same transaction."""
        assert self.calls is not None
        return _advance_run(self.calls, self.layout, run, self._request())

    def record(self, recovered: recovery.Recovery) -> None:
        if not self.options.quiet:
            print(f"recovering: {recovered.message}", file=sys.stderr)
        os.environ.pop(faults.ENV, None)  # fault points fire in the first run only, as in `Runner`

    def stop(self, run: int) -> None:
        stop_all(self.tasks)

    def start(self, run: int, *, delay_s: float) -> None:
        time.sleep(delay_s)
        # A coordinator that saw the final epoch committed has exited 0; a task lost after
        # that still needs the new run led (its restore point says finished, its tasks
        # publish what they hold and exit), so a candidate takes each finished one's place.
        self.coordinators = [c if c.alive() else self._candidate() for c in self.coordinators]
        self.tasks = self._start_tasks(run)

    def _request(self) -> RestoreRequest | None:
        """What every run of the command asks its coordinator: the command's new lineage (started once per
        nonce), if any. A run that ended before its coordinator chose a restore point must not leave its
        successor in the old lineage."""
        return None if self.lineage is None else RestoreRequest(new_lineage=self.lineage)

    def _dead_tasks(self) -> list[tuple[Child, int]]:
        """Task processes that exited with an error, with their exit codes."""
        return [(t, code) for t in self.tasks if (code := t.poll()) not in (None, 0)]

    def _finished(self) -> bool:
        return all(t.poll() == 0 for t in self.tasks)

    def _replace_dead_coordinators(self) -> None:
        for i, child in enumerate(self.coordinators):
            code = child.poll()
            if code is None or code == 0:
                continue
            if self.started_candidates > len(self.coordinators) + self.options.max_restarts:
                raise JobFailed(f"coordinator {child.name} exited with {code}:\n{child.tail()}")
            self.coordinators[i] = self._candidate()

    def _candidate(self) -> Child:
        name = resource_name(self.plans.deployment.job_id, "coordinator", str(self.started_candidates))
        self.started_candidates += 1
        return self._spawn("coordinator", name)

    def _start_tasks(self, run: int) -> list[Child]:
        return [
            self._spawn("task", f"{t.name}-r{run}", task_id=t.task_id, run=run)
            for t in self.plans.deployment.tasks
        ]

    def _spawn(self, role: str, name: str, *, task_id: str | None = None, run: int | None = None) -> Child:
        assert self.zygote is not None
        path = [*self.options.python_path, _PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
            **NodeEnv(
                plan_dir=str(self.plan_dir.resolve()),
                etcd=self.etcd,
                lease_ttl=LEASE_TTL,
                secret_file=str(self.secret_file.resolve()),
                tls=True,
                attempt=name,
                task_id=task_id,
                run=run,
                parent=os.getpid(),
            ).to_env(),
        }
        # appended to: a runner started again names its coordinators from 0 again
        log = self.home / "logs" / f"{name}.log"
        order = zygote.Order(role, f"nopstream {role} {name}", str(log), env, self.options.python_path)
        try:
            return self.zygote.fork(name, order)
        except zygote.ForkFailed as failed:
            raise JobFailed(str(failed)) from None


T = TypeVar("T")


def _retried(calls: EtcdCalls, call: Callable[[EtcdBackend], Awaitable[T]]) -> T:
    """What `call` gives once etcd answers: an outage is waited out, as the processes do."""
    while True:
        try:
            return calls(call)
        except StoreUnavailable:
            time.sleep(0.5)


def _reach(calls: EtcdCalls, wait_s: float, *, quiet: bool) -> None:
    """Return once etcd answers; say once that it waits; StartRefused after `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            calls(lambda backend: backend.revision())
            return
        except StoreUnavailable:
            if time.monotonic() >= deadline:
                raise StartRefused(
                    f"etcd at {calls.where} did not answer within {wait_s:g} s (is it running there?)"
                ) from None
            if not said and not quiet:
                print(f"waiting for etcd at {calls.where} (at most {wait_s:g} s)", file=sys.stderr)
                said = True
            time.sleep(0.5)


def _lost_run(calls: EtcdCalls, layout: Layout, run: int) -> str | None:
    """Why etcd no longer holds run `run` (its run key missing or behind it), or None (also while
    etcd cannot be reached: an outage is waited out, as the processes do)."""
    try:
        current = calls(lambda backend: Registry(backend, layout).current_run())
    except StoreUnavailable:
        return None
    if current >= run:
        return None
    return f"etcd lost the job's coordination state (its run reads {current}, the run is {run})"


def _advance_run(
    calls: EtcdCalls, layout: Layout, expected: int | None, request: RestoreRequest | None
) -> int:
    """Move the run one past `expected` (None: past whatever it is now) by compare-and-swap, with the new
    run's restore request in the same transaction; an outage is waited out (a try that timed out after
    its swap is safe again: `next_run` then reads the run it made, a run of our own skips one)."""
    restore = None if request is None else request.to_json()

    async def advance(backend: EtcdBackend) -> int | None:
        registry = Registry(backend, layout)
        if expected is not None:
            return await registry.next_run(expected, restore=restore)
        seen = await registry.current_run()
        return seen + 1 if await registry.advance_run(seen, restore=restore) else None  # ours, past any

    while (run := _retried(calls, advance)) is None:
        pass
    return run


def _wait(children: list[Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for child in children:
        child.wait(max(0.0, deadline - time.monotonic()))
