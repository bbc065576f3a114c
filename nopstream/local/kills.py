"""The schedule of `nopstream chaos`'s run under kills: what is killed, when, and which fault points fire.

A seeded order of events: SIGKILLs (of a task process, a coordinator candidate, or the
whole runner) and one armed fault point (`nopstream.faults`) for each protocol step the
job has. A share of the kills lands at once: the first of a runner's start within its
first second, the others soon after the event before them (startup and the first epoch
are where bugs hid before). Every other event waits until an epoch became durable after
the event before it, read from the run's checkpoint storage, then lands at a random
moment within the next two checkpoint intervals: the recovery it causes restores keyed
state, timers, source cursors and pending transactions. A kill before anything is
durable restores nothing, and proves nothing about the restore code.

Until the last event is done, the run's sources wait at the end of their input
(`faults.holding`), taking barriers: a fast machine does not end the job before its
schedule. Only the sink steps (FLOWING) need records moving: they come in the schedule's
first half, one not reached within a few epochs waits for the end of the schedule. Once only
sink steps are left, they are armed together and the input ends: a job whose sinks write at
its end (final counts, the matches a pattern flushes) stages and publishes its last epoch again
after each recovery, so each step is reached in turn.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nopstream import faults
from nopstream.checkpoint import catalog
from nopstream.checkpoint.storage import Storage
from nopstream.errors import RestoreRefused
from nopstream.local.children import Child
from nopstream.model.load import load_data
from nopstream.node import checkpointing
from nopstream.plan import compiler

CAUSED = ("during-restore",)
"""Fault points of steps a failure-free run does not take: the kills cause restores."""

FLOWING = ("after-stage", "before-publish", "mid-commit")
"""Fault points passed only while records reach a sink."""
FLOWING_GRACE = 3
"""New durable epochs an armed FLOWING point may go unreached before it waits for the schedule's end."""

SAVEPOINT_LOST = 2
"""New durable epochs after a savepoint was taken, none of them it, that show a recovery dropped it
(a savepoint in flight fails with its run, as in Flink): it is asked for again."""

POLL = 0.05  # seconds between looks at the storage, the fault directory, the runner


@dataclass(frozen=True)
class Event:
    """One step of the schedule: a SIGKILL (at once, or after progress), or an armed fault point."""

    point: str | None = None
    early: bool = False

    def __str__(self) -> str:
        return self.point or ("kill at once" if self.early else "kill")


def plan_events(rng: random.Random, kills: int, points: set[str], early_share: float) -> list[Event]:
    """`kills` SIGKILLs (a share `early_share` of them at once) and one event per point, shuffled; a
    point chaos causes (CAUSED) is never last, as it needs a whole recovery after it is armed, the
    longest of any step (on etcd a coordinator's lease runs out first), and the job may end before;
    the sink steps (FLOWING) come in the first half, while records still move."""
    events = [Event(early=rng.random() < early_share) for _ in range(kills)]
    events += [Event(point) for point in sorted(points)]
    rng.shuffle(events)
    if len(events) > 1 and events[-1].point in CAUSED:
        events.insert(rng.randrange(len(events) - 1), events.pop())
    half = (len(events) + 1) // 2
    for late in [i for i in range(half, len(events)) if events[i].point in FLOWING]:
        others = [i for i in range(half) if events[i].point not in (*FLOWING, *CAUSED)]
        if others:
            early = rng.choice(others)
            events[early], events[late] = events[late], events[early]
    return events


class Progress:
    """The highest durable epoch of a chaos run's job, read from its checkpoint storage."""

    def __init__(self, job: dict[str, Any]) -> None:
        """The storage and namespace the (isolated) job `job` checkpoints into."""
        plans = compiler.compile_model(load_data(job))
        self.storage: Storage = checkpointing.open_storage(plans.deployment)
        self.namespace = plans.partitioned.identity.checkpoint_namespace
        self.interval = plans.deployment.checkpoint.interval_ms / 1000

    def durable(self) -> int:
        """The highest epoch with a manifest now (0 before any)."""
        try:
            return max(catalog.durable_epochs(self.storage, self.namespace), default=0)
        except (OSError, RestoreRefused):  # storage being written: the next look sees it
            return 0


@dataclass
class Reached:
    """What the schedule did to one run."""

    kills: Counter[str] = field(default_factory=Counter)
    hit: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    """Sink steps moved to the end of the schedule (not reached while the input was held)."""


class Schedule:
    """Carries the events out over the starts of one run; a whole-runner kill ends a start."""

    def __init__(
        self,
        events: list[Event],
        rng: random.Random,
        progress: Progress,
        faults_dir: Path,
        *,
        first_kill: tuple[float, float],
        between_kills: tuple[float, float],
        fault_wait: float,
        savepoint: Callable[[], bool],
        deadline: float,
    ) -> None:
        """`savepoint` asks the running job for one, True once its coordinator took the request; no
        event waits past `deadline` (time.monotonic())."""
        self.events = deque(events)
        self.rng = rng
        self.progress = progress
        self.faults_dir = faults_dir
        self.first_kill, self.between_kills = first_kill, between_kills
        self.fault_wait = fault_wait
        self.savepoint = savepoint
        self.deadline = deadline
        self.reached = Reached()
        self.baseline = 0  # the durable epoch when the last event landed
        self.armed: str | None = None  # a point armed and not yet reached
        faults.hold(faults_dir, held=bool(self.events))

    def drive(self, proc: Child) -> None:
        """Carry out events while this start of the runner lives; return once it ended, or all are done."""
        if self._only_sink_steps():
            self._finale(proc)
            return
        if self.armed is not None:  # armed when the runner died: its next start reaches it
            self._await(proc)
        first = True
        while self.events and proc.poll() is None:
            if self._only_sink_steps():
                self._finale(proc)
                break
            event = self.events[0]
            if event.early:
                _sleep(proc, self.rng.uniform(*(self.first_kill if first else self.between_kills)))
            elif self._progressed(proc):
                _sleep(proc, self.rng.uniform(0, 2 * self.progress.interval))
            first = False
            if proc.poll() is not None:
                break
            self.events.popleft()
            if event.point is None:
                whole = self._kill(proc)
            else:
                faults.arm(self.faults_dir, event.point)
                self.armed = event.point
                # chaos alone brings these steps about: a restore (after a task's death), a savepoint
                whole = event.point == "during-restore" and self._kill(proc, roll=1.0)
                if not whole:
                    self._await(proc)
            self.baseline = self.progress.durable()
            if whole:
                return
        if not self.events:
            faults.hold(self.faults_dir, held=False)

    def finish(self) -> None:
        """The run ended: a point still armed was not reached."""
        if self.armed is not None:
            self._settle()
        faults.hold(self.faults_dir, held=False)

    def _progressed(self, proc: Child) -> bool:
        """Wait until an epoch after the baseline is durable; False when the run ended (or time ran out)."""
        while proc.poll() is None and time.monotonic() < self.deadline:
            if self.progress.durable() > self.baseline:
                return True
            time.sleep(POLL)
        return False

    def _kill(self, proc: Child, *, roll: float | None = None) -> bool:
        """SIGKILL a task, a coordinator candidate or the whole runner (by `roll`, random by default:
        1.0 is a task); True for the whole runner."""
        victims = _victims(proc.pid)
        roll = self.rng.random() if roll is None else roll
        kind = "coordinator" if roll < 0.4 and victims["coordinator"] else "task"
        if roll < 0.2 or not victims[kind]:  # no task process between two attempts: the runner then
            proc.kill()
            self.reached.kills["whole runner"] += 1
            return True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.rng.choice(victims[kind]), signal.SIGKILL)
        self.reached.kills[kind] += 1
        return False

    def _await(self, proc: Child) -> None:
        """Wait until a process of the run reaches the armed point, the run ends, or `fault_wait`
        seconds passed; a runner SIGKILLed meanwhile leaves it armed for its next start. A sink step
        (FLOWING) that FLOWING_GRACE new durable epochs did not reach goes to the back of the schedule
        (the input has ended and is held). For `during-savepoint` it asks for a savepoint, again each
        time SAVEPOINT_LOST epochs went by without it."""
        assert self.armed is not None
        savepoint = self.armed == "during-savepoint"
        asked: int | None = None  # the durable epoch when the savepoint was last taken
        deadline = min(self.deadline, time.monotonic() + self.fault_wait)
        others = self.armed in FLOWING  # `drive` arms a sink step alone only while other events are left
        since = self.progress.durable()
        while proc.poll() is None and time.monotonic() < deadline:
            if faults.was_hit(self.faults_dir, self.armed):
                break
            if savepoint:
                durable = self.progress.durable()
                if (asked is None or durable >= asked + SAVEPOINT_LOST) and self.savepoint():
                    asked = durable
            if others and self.progress.durable() >= since + FLOWING_GRACE and self._defer():
                return
            time.sleep(POLL)
        if proc.poll() == -signal.SIGKILL and not faults.was_hit(self.faults_dir, self.armed):
            return
        self._settle()
        _sleep(proc, self.progress.interval)  # the crash is seen (a task's death, the runner's) first

    def _only_sink_steps(self) -> bool:
        """Whether every event left (and the point armed, if any) is a sink step."""
        left = [e.point for e in self.events] + ([self.armed] if self.armed else [])
        return bool(left) and all(p in FLOWING for p in left)

    def _finale(self, proc: Child) -> None:
        """Arm every sink step left at once and let the input end; wait until each is reached, the run
        ends, or `fault_wait` seconds a step passed. One at a time, the next step would be armed only
        after an epoch became durable: after the job's last epoch, which is past every step."""
        points = [e.point for e in self.events if e.point] + ([self.armed] if self.armed else [])
        self.events.clear()
        self.armed = None
        for point in points:
            faults.arm(self.faults_dir, point)
        faults.hold(self.faults_dir, held=False)
        deadline = min(self.deadline, time.monotonic() + self.fault_wait * len(points))
        while proc.poll() is None and time.monotonic() < deadline:
            if all(faults.was_hit(self.faults_dir, point) for point in points):
                break
            time.sleep(POLL)
        for point in points:
            self._count(point)

    def _defer(self) -> bool:
        """Put the armed sink step back at the end of the schedule; False when a process took it first."""
        assert self.armed is not None
        if not faults.disarm(self.faults_dir, self.armed):
            return False
        self.events.append(Event(self.armed))
        self.reached.deferred.append(self.armed)
        self.armed = None
        return True

    def _settle(self) -> None:
        """Count the armed point hit, or missed (then disarmed)."""
        assert self.armed is not None
        point, self.armed = self.armed, None
        self._count(point)

    def _count(self, point: str) -> None:
        """Count an armed point hit, or missed (then disarmed)."""
        (self.reached.missed if faults.disarm(self.faults_dir, point) else self.reached.hit).append(point)


def take_savepoint(
    proc: Child, progress: Progress, faults_dir: Path, savepoint: Callable[[], bool], deadline: float
) -> None:
    """Ask the running job for one savepoint once an epoch is durable (a failure-free run takes the
    savepoint step too, so that its fault points count as steps the job has), then let its input end
    (held from its start: unpaced, it could end first); give up when it ends or at `deadline`."""
    try:
        while proc.poll() is None and time.monotonic() < deadline and progress.durable() == 0:
            time.sleep(POLL)
        while proc.poll() is None and time.monotonic() < deadline and not savepoint():
            time.sleep(POLL)
    finally:
        faults.hold(faults_dir, held=False)


def _sleep(proc: Child, seconds: float) -> None:
    """Sleep `seconds`, or less when the runner ends meanwhile."""
    end = time.monotonic() + seconds
    while proc.poll() is None and (left := end - time.monotonic()) > 0:
        time.sleep(min(POLL, left))


def _victims(pid: int) -> dict[str, list[int]]:
    """The runner's task processes and coordinator candidates, by the titles they show in `ps` (Linux
    /proc): `nopstream task ...`, `nopstream coordinator ...`; a process forked a moment ago has none yet."""
    found: dict[str, list[int]] = {"task": [], "coordinator": []}
    for child in children(pid):
        with contextlib.suppress(OSError):
            title = Path(f"/proc/{child}/cmdline").read_bytes().split(b" ")[:2]
            if title in ([b"nopstream", b"task"], [b"nopstream", b"coordinator"]):
                found[title[1].decode()].append(child)
    return found


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
