"""Events that cut a job's wait for its next pass short: a lost pod or a changed spec is acted on at once.

Each job's daemon passes every PASS_SECONDS (SETTLED_PASS_SECONDS once settled) and,
between passes, waits on its job's event here; the pod watch sets it when one of the
job's pods is deleted, is being deleted, has ended or has a container that terminated,
and the job's watch when its spec has a new generation. Other pod changes (created,
scheduled, ready) and status writes wake nothing: the periodic pass sees them, and a
pass per status change of every pod would only add load while a run starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from nopstream_operator.observed import pod_view

_ENDED = frozenset({"Failed", "Succeeded"})


def is_loss(event_type: str | None, pod: dict[str, Any]) -> bool:
    """Whether a pod event says the pod is gone or going: deleted or deleting, ended, or terminated."""
    seen = pod_view(pod)  # the pass's own reading of a pod
    return event_type == "DELETED" or seen.deleting or seen.phase in _ENDED or seen.exit_code is not None


class Wakeups:
    """One asyncio event per job (namespace, job id), on the operator's event loop."""

    def __init__(self) -> None:
        """No job waits yet."""
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        self._generations: dict[tuple[str, str], int | None] = {}

    def watch(self, namespace: str, job_id: str) -> None:
        """A daemon drives the job here from now on: its wakes are kept until it waits."""
        self._events.setdefault((namespace, job_id), asyncio.Event())

    def wake(self, namespace: str, job_id: str) -> None:
        """Start the job's next pass now (nothing when no daemon drives the job here)."""
        if (event := self._events.get((namespace, job_id))) is not None:
            event.set()

    def generation(self, namespace: str, job_id: str, generation: int | None) -> None:
        """The job's spec is at `generation`: a new one starts the next pass now (status writes, which
        leave it as it is, wake nothing)."""
        key = (namespace, job_id)
        if key in self._events and self._generations.get(key) != generation:
            self._generations[key] = generation
            self.wake(namespace, job_id)

    def wake_all(self) -> None:
        """Start the next pass of every job driven here now (a node was lost: any may have pods on it)."""
        for event in self._events.values():
            event.set()

    async def wait(self, namespace: str, job_id: str, seconds: float) -> bool:
        """Wait up to `seconds` for a wake of the watched job; whether one came (it is consumed)."""
        event = self._events[(namespace, job_id)]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()
        woken = event.is_set()
        event.clear()
        return woken

    def forget(self, namespace: str, job_id: str) -> None:
        """The job's daemon ended: drop its event and the generation seen."""
        self._events.pop((namespace, job_id), None)
        self._generations.pop((namespace, job_id), None)
