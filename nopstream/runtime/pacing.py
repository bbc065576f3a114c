"""How a task paces itself: its settings, the size of its next source batch, and how long a batch
held the event loop."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


def wall_clock_ms() -> int:
    """Milliseconds since the epoch."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class TaskSettings:
    """Batch size, processing-time tick and idle poll of a task."""

    batch_size: int = 1000
    batch_target_ms: float = 50.0
    """How long a source batch may hold the event loop: a barrier command or credit waits up to that
    long for each step of its HTTP exchange, so a checkpoint of slow functions takes about ten of it."""
    tick_ms: int = 100
    idle_poll_ms: int = 20
    combiner_keys: int = 1 << 16
    """The keys a combiner holds before it sends its partials early (`runtime.combiner`)."""
    sink_call_s: float = 120.0
    """How long one sink call (prepare, commit, recover) may take before the task fails."""
    source_pause_ms: int = 0
    """A source's pause after each batch it read (`nopstream chaos --pace`)."""


class LoopHold:
    """How long the code after its creation held the event loop before first letting it run.

    Time spent waiting (for channel credit, under backpressure) does not count: only
    the synchronous stretch, which is what delays the task's other work.
    """

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.released: float | None = None
        asyncio.get_running_loop().call_soon(self._release)

    def _release(self) -> None:
        self.released = time.monotonic()

    def seconds(self) -> float:
        """The stretch so far (all of it when the loop has not run since)."""
        return (self.released if self.released is not None else time.monotonic()) - self.started


def next_batch_size(size: int, records: int, seconds: float, settings: TaskSettings) -> int:
    """The next source read size: a batch should hold the event loop for about the target.

    The chain runs user functions on the event loop; a batch that holds it for seconds
    delays everything else the task does (barrier commands, ACKs, channel credit).
    Slow functions shrink the batches, fast ones grow them back up to the configured size.
    """
    target = settings.batch_target_ms / 1000
    if seconds > target and records:
        return max(1, int(records * target / seconds))
    return min(settings.batch_size, size * 2)
