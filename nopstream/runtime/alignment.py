"""Barrier alignment over a task's input channels, of any number of inputs: pure logic, no I/O.

After barrier N arrives on a channel, that channel is held back (the gate blocks it)
until barrier N has arrived on every open channel; then the task snapshots and
forwards N, and every channel is read again. A channel that ended its stream (after
the final barrier) does not hold alignment back. A barrier of another epoch while one
is being aligned is a protocol violation: one epoch is in flight at a time.
"""

from __future__ import annotations

from collections.abc import Collection

from nopstream.runtime.frames import Barrier


class AlignmentError(RuntimeError):
    """A barrier of another epoch arrived while one was being aligned."""


class Alignment:
    """The barrier being aligned, if any, and the channels that delivered it."""

    def __init__(self) -> None:
        """Nothing being aligned."""
        self.barrier: Barrier | None = None
        self.arrived: set[str] = set()
        self.started = 0.0

    def arrive(self, channel: str, barrier: Barrier, now: float) -> None:
        """`barrier` arrived on `channel` (at monotonic time `now`); the caller holds the channel back.

        AlignmentError when another epoch's barrier is being aligned.
        """
        if self.barrier is None:
            self.barrier, self.arrived, self.started = barrier, set(), now
        elif barrier.epoch != self.barrier.epoch:
            raise AlignmentError(
                f"barrier {barrier.epoch} on {channel} while aligning barrier {self.barrier.epoch}"
            )
        self.arrived.add(channel)

    def waiting(self, open_channels: Collection[str]) -> bool:
        """Whether a barrier is being aligned and some open channel has not delivered it yet."""
        return self.barrier is not None and not self.arrived.issuperset(open_channels)

    def complete(self, open_channels: Collection[str]) -> Barrier | None:
        """The aligned barrier once every open channel delivered it (alignment then starts afresh);
        None while it waits, or when nothing is being aligned."""
        if self.barrier is None or not self.arrived.issuperset(open_channels):
            return None
        done, self.barrier, self.arrived = self.barrier, None, set()
        return done
