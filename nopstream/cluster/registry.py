"""The run generation and the task registry.

`run` only moves by compare-and-swap from the value the caller saw, so many events
about one failure advance it once. A task registers under its run as
`runs/{run}/tasks/{taskId}` -> `{"attempt", "endpoint"}`, bound to its own lease: when
the task dies its registration goes with its lease, and watchers see the departure.

Which process serves a task in a run: the one made for that run (its attempt's run),
unless the run was entered with a serving map (`runs/{run}/serving`, task id -> attempt),
which a recovery writes to hand the run to pods it keeps or to standbys (`serves`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

from nopstream.cluster.backend import Backend, StoreUnavailable
from nopstream.cluster.layout import Layout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    """A task's registration in a run: in etcd, and in a task process's POST /register to the local runner."""

    task_id: str
    attempt: str
    endpoint: str

    def to_json(self) -> dict[str, str]:
        """Its value (the task id is its key, or beside it in a message)."""
        return {"attempt": self.attempt, "endpoint": self.endpoint}

    @classmethod
    def from_json(cls, task_id: str, value: dict[str, Any]) -> Registration:
        """From `to_json`'s object; ValueError naming the field that is not a string."""
        for name in ("attempt", "endpoint"):
            if not isinstance(value.get(name), str):
                raise ValueError(f"{name} of a registration is a string, not {value.get(name)!r}")
        return cls(task_id, value["attempt"], value["endpoint"])


@dataclass(frozen=True)
class FailureReport:
    """A task process of a kept pod failed in a run (`Registry.report_failed`); the pod lives on."""

    attempt: str
    exit_code: int
    at_ms: int
    """When the pod's next task process reported it (wall clock, ms since the Unix epoch)."""


@dataclass(frozen=True)
class Change:
    """A task arrived in or departed from a run."""

    kind: str  # "arrived" or "departed"
    task_id: str
    registration: Registration | None


class Registry:
    """The run counter and the task registry of one job."""

    def __init__(self, backend: Backend, layout: Layout) -> None:
        """The registry of the job at `layout`."""
        self.backend = backend
        self.layout = layout

    async def current_run(self) -> int:
        """The current run (0 before the first)."""
        entry = await self.backend.get(self.layout.run)
        return 0 if entry is None else int(entry.value)

    async def advance_run(
        self, expected: int, *, serving: Mapping[str, str] | None = None, restore: bytes | None = None
    ) -> bool:
        """Move the run from `expected` to `expected + 1`; False when it had moved already.

        With `serving` (task id -> attempt), those processes serve the new run (`serves`):
        pods a recovery keeps, standbys it adopts; with `restore` (a `RestoreRequest`'s
        JSON), its coordinator starts a new lineage or an upgrade's plan. Both keys are
        written in the run's transaction, so no run is ever entered with another run's
        map or request, nor entered before its request is there to be read.
        """
        return await self._swap_run(expected, expected + 1, serving=serving, restore=restore)

    async def _swap_run(
        self, old: int, new: int, *, serving: Mapping[str, str] | None, restore: bytes | None
    ) -> bool:
        """Move the run key from `old` (0: absent) to `new`, with `serving` and `restore` for `new`;
        whether it moved."""
        was = None if old == 0 else str(old).encode()
        also = {} if serving is None else {self.layout.serving(new): json.dumps(dict(serving)).encode()}
        if restore is not None:
            also[self.layout.restore_request(new)] = restore
        return await self.backend.compare_and_swap(self.layout.run, was, str(new).encode(), also=also)

    async def next_run(
        self, expected: int, *, serving: Mapping[str, str] | None = None, restore: bytes | None = None
    ) -> int:
        """Advance the run from `expected`; the run now current either way.

        When another watcher of the same failure advanced it first, its run is ours too.
        A run key that is missing or behind `expected` is lost coordination state (etcd
        lost its data): the run is written past `expected`, never reused, since
        fencing by run number must still refuse a zombie of the runs before.
        """
        while True:
            if await self.advance_run(expected, serving=serving, restore=restore):
                return expected + 1
            current = await self.current_run()
            if current >= expected:
                return current
            log.warning("the run key reads %d, behind run %d: etcd lost it", current, expected)
            if await self._swap_run(current, expected + 1, serving=serving, restore=restore):
                return expected + 1

    async def serving(self, run: int) -> dict[str, str] | None:
        """The run's serving map (task id -> attempt), or None when the run was entered without one."""
        entry = await self.backend.get(self.layout.serving(run))
        return None if entry is None else dict(json.loads(entry.value))

    async def serves(self, run: int, task_id: str, attempt: str, *, made_for: int, standby: bool) -> bool:
        """Whether process `attempt` of `task_id`, made for run `made_for`, serves run `run`.

        As the run's serving map says; without one, the process made for the run serves it,
        a standby never (a restart, an upgrade or a resume starts pods of its own).
        """
        serving = await self.serving(run)
        if serving is None:
            return run == made_for and not standby
        return serving.get(task_id) == attempt

    async def next_to_serve(
        self, task_id: str, attempt: str, *, made_for: int, standby: bool, after: int, poll: float = 0.1
    ) -> int | None:
        """Wait until the current run is at least `made_for` and past `after`; that run when this
        process serves it (`serves`), None when it does not (it is not needed)."""
        while True:
            with contextlib.suppress(StoreUnavailable):
                current = await self.current_run()
                if current >= made_for and current > after:
                    serves = await self.serves(current, task_id, attempt, made_for=made_for, standby=standby)
                    return current if serves else None
            await asyncio.sleep(poll)

    async def run_past(self, run: int, *, poll: float = 0.25) -> int:
        """The current run, once it is past `run` (a recovery moved on); etcd outages are waited out."""
        while True:
            with contextlib.suppress(StoreUnavailable):
                current = await self.current_run()
                if current > run:
                    return current
            await asyncio.sleep(poll)

    async def report_failed(self, run: int, task_id: str, attempt: str, exit_code: int) -> None:
        """Say that `task_id`'s process in pod `attempt` failed in `run` with `exit_code`, now (the pod
        lives on: the operator reads this instead of a failed pod)."""
        at = int(time.time() * 1000)
        value = json.dumps({"attempt": attempt, "exitCode": exit_code, "at": at}).encode()
        await self.backend.put(self.layout.failed(run, task_id), value)

    async def failed(self, run: int) -> dict[str, FailureReport]:
        """The failure reports of `run`, by task id."""
        prefix = self.layout.failures(run)
        found = await self.backend.get_prefix(prefix)
        reports = {key[len(prefix) :]: json.loads(e.value) for key, e in found.items()}
        return {
            task: FailureReport(r["attempt"], int(r["exitCode"]), int(r["at"])) for task, r in reports.items()
        }

    async def register(self, run: int, registration: Registration, *, lease: int) -> None:
        """Register a task under a run, bound to its lease."""
        value = json.dumps(registration.to_json()).encode()
        await self.backend.put(self.layout.task(run, registration.task_id), value, lease=lease)

    async def tasks(self, run: int) -> dict[str, Registration]:
        """Every task registered under a run."""
        prefix = self.layout.tasks(run)
        found = await self.backend.get_prefix(prefix)
        return {
            key[len(prefix) :]: self._registration(key[len(prefix) :], e.value) for key, e in found.items()
        }

    async def watch(self, run: int, *, start_revision: int = 0) -> AsyncGenerator[Change, None]:
        """Arrivals and departures under a run, as they happen."""
        prefix = self.layout.tasks(run)
        async with contextlib.aclosing(
            self.backend.watch_prefix(prefix, start_revision=start_revision)
        ) as events:
            async for event in events:
                task_id = event.key[len(prefix) :]
                if event.kind == "put":
                    yield Change("arrived", task_id, self._registration(task_id, event.value))
                else:
                    yield Change("departed", task_id, None)

    @staticmethod
    def _registration(task_id: str, value: bytes) -> Registration:
        return Registration.from_json(task_id, json.loads(value))
