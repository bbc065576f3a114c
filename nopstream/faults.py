"""Fault points: crash-only failures placed at named dangerous moments, for tests.

`NOPSTREAM_FAULTS="point@n,..."` arms a point: the n-th time this process passes it,
the fault fires: by default the process kills itself with SIGKILL (a crash, not an
exception); a caller may pass another action (the runner kills a task process).
Points: `before-manifest` and `after-durable` (the coordinator kills a task there),
`coordinator-before-manifest` (the coordinator's own process dies there),
`during-alignment` (a task holding back a channel), `after-stage` (a sink that
staged or prepared a transaction, before its barrier is acknowledged: no manifest
covers it), `before-publish` (a sink whose epoch is durable, before it publishes or
commits the prepared transaction), `mid-commit` (a sink between publishing
transactions). Unset (the default), a point costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

ENV = "NOPSTREAM_FAULTS"
_passes: dict[str, int] = {}


def reached(point: str, action: Callable[[], None] | None = None) -> None:
    """Count a pass of `point`; fire the fault when this is the armed pass."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    armed = dict(item.split("@", 1) for item in spec.split(",") if "@" in item)
    if point not in armed:
        return
    _passes[point] = _passes.get(point, 0) + 1
    if _passes[point] == int(armed[point]):
        if action is not None:
            action()
        else:
            os.kill(os.getpid(), signal.SIGKILL)
