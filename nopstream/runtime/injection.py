"""The barriers a coordinator asked a source task to inject, waiting for its next safe point.

A coordinator that takes over an epoch in flight triggers it again: a source that
injected it already ignores the repeat. A final barrier asked for before the source
has read all its input (a forged or mistaken source-finished) waits for the end of its
input, so that every record read meanwhile is in the final epoch instead of after it, lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from nopstream.plan.epochs import EpochKind
from nopstream.runtime.frames import Barrier

log = logging.getLogger(__name__)


class Injections:
    """One source task's barriers to inject, in the order they were asked for."""

    def __init__(self, task_id: str) -> None:
        """No barrier asked for yet (`task_id` names the task in the log)."""
        self.task_id = task_id
        self.pending: deque[Barrier] = deque()
        self.arrived = asyncio.Event()  # set when a barrier is added; the waiter clears it
        self._last = 0
        self._deferred_final: Barrier | None = None

    def ask(self, epoch: int, kind: EpochKind, *, data_ended: bool) -> bool:
        """Barrier `epoch` of `kind` is to be injected; False if it was asked for already."""
        if epoch <= self._last:
            return False
        self._last = epoch
        if kind == EpochKind.FINAL and not data_ended:
            log.warning(
                "task %s: final barrier %d before the end of its input: deferred", self.task_id, epoch
            )
            self._deferred_final = Barrier(epoch, kind)
            return True
        self.pending.append(Barrier(epoch, kind))
        self.arrived.set()
        return True

    def input_ended(self) -> None:
        """The source read all its input: a final barrier deferred until then is due now."""
        if self._deferred_final is not None:
            self.pending.append(self._deferred_final)
            self._deferred_final = None

    async def wait(self) -> None:
        """Return once a barrier was asked for since the last wait."""
        await self.arrived.wait()
        self.arrived.clear()
