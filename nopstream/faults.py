"""Fault points: crash-only failures placed at named dangerous moments, for tests and chaos.

`NOPSTREAM_FAULTS="point@n,..."` arms a point: the n-th time this process passes it,
the fault fires: by default the process kills itself with SIGKILL (a crash, not an
exception); a caller may pass another action (the runner kills a task process).

`NOPSTREAM_FAULTS_DIR=DIR` arms points from outside, once for every process of a run
(`nopstream chaos`): a file `DIR/POINT.armed` fires the first pass of POINT in any
process, which renames it `POINT.hit` (a rename is atomic: one process wins); armed with
`pause`, the process stops itself there instead (SIGSTOP) and goes on when continued, as a
process paused by its machine would (a deposed coordinator, resumed). Every
process also leaves `DIR/POINT.passed` the first time it passes a point, so a
failure-free run tells which steps a job has. While a file `DIR/end-of-input.hold`
exists, a source that read all its input waits there, taking barriers, before it ends
(`holding`): chaos keeps a run going until its schedule is done, however fast the
machine reads.

Each point is named in `POINTS`. The points where the coordinator kills a task are
passed only where a runner gave it that action (`nopstream run`, whose tasks are its
children); elsewhere its own death at the same step is `coordinator-*`. Unset (the
default), a point costs one environment lookup.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

ENV = "NOPSTREAM_FAULTS"
DIR_ENV = "NOPSTREAM_FAULTS_DIR"
ARMED, HIT, PASSED = ".armed", ".hit", ".passed"
PAUSE = "pause"
HOLD = "end-of-input.hold"

POINTS = {
    "before-manifest": "all ACKs in, before the manifest is written: the coordinator kills a task",
    "coordinator-before-manifest": "the coordinator dies before it writes the manifest",
    "after-durable": "the manifest written, before sinks are told to commit: the coordinator kills a task",
    "coordinator-after-durable": "the coordinator dies between DURABLE and COMMITTED",
    "during-savepoint": "a savepoint's ACKs in, before its manifest: the coordinator kills a task",
    "during-alignment": "a task dies holding back a channel whose barrier arrived",
    "after-stage": "a sink dies after staging (or preparing) a transaction no manifest covers yet",
    "before-publish": "a sink dies before publishing (committing) a transaction of a durable epoch",
    "mid-commit": "a sink dies between publishing transactions",
    "during-restore": "a task dies after loading state from a durable epoch, before its sinks recover",
}
"""Every fault point, and the moment it stands for."""

_passes: dict[str, int] = {}
_passed: set[str] = set()


def reached(point: str, action: Callable[[], None] | None = None) -> None:
    """Count a pass of `point`; fire the fault when this is the armed pass."""
    folder = os.environ.get(DIR_ENV)
    taken = _taken(Path(folder), point) if folder else None
    if taken == PAUSE:
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if taken is not None:
        _fire(action)
        return
    spec = os.environ.get(ENV)
    if not spec:
        return
    armed = dict(item.split("@", 1) for item in spec.split(",") if "@" in item)
    if point not in armed:
        return
    _passes[point] = _passes.get(point, 0) + 1
    if _passes[point] == int(armed[point]):
        _fire(action)


def _fire(action: Callable[[], None] | None) -> None:
    if action is not None:
        action()
    else:
        os.kill(os.getpid(), signal.SIGKILL)


def _taken(folder: Path, point: str) -> str | None:
    """Note the first pass of `point` in this process; the armed fault's action when this pass takes
    it ("" for a kill, PAUSE), else None."""
    if point not in _passed:
        _passed.add(point)
        with contextlib.suppress(OSError):
            (folder / (point + PASSED)).touch()
    try:
        (folder / (point + ARMED)).rename(folder / (point + HIT))
    except FileNotFoundError:
        return None
    with contextlib.suppress(OSError):
        return (folder / (point + HIT)).read_text().strip()
    return ""


def arm(folder: Path, point: str, *, pause: bool = False) -> None:
    """Arm `point` once for every process of the run that has `folder` as its DIR_ENV: the process that
    takes it is killed, or with `pause` stops itself (SIGSTOP) until continued."""
    (folder / (point + ARMED)).write_text(PAUSE if pause else "")


def disarm(folder: Path, point: str) -> bool:
    """Take back an armed point; False when a process took it first (it was hit)."""
    try:
        (folder / (point + ARMED)).unlink()
    except FileNotFoundError:
        return False
    return True


def was_hit(folder: Path, point: str) -> bool:
    """Whether a process took the armed `point`."""
    return (folder / (point + HIT)).exists()


def passed(folder: Path) -> set[str]:
    """The points some process of the run passed."""
    return {p.name.removesuffix(PASSED) for p in folder.glob("*" + PASSED)} & POINTS.keys()


def holding() -> bool:
    """Whether a source at the end of its input waits (DIR_ENV set and `DIR/end-of-input.hold` there)."""
    folder = os.environ.get(DIR_ENV)
    return folder is not None and (Path(folder) / HOLD).exists()


def hold(folder: Path, *, held: bool) -> None:
    """Hold the sources of the run whose DIR_ENV is `folder` at the end of their input, or let them end."""
    if held:
        (folder / HOLD).touch()
    else:
        (folder / HOLD).unlink(missing_ok=True)
