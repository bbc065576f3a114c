"""The kinds and states of epoch: one name each, for barriers, manifests, the epoch log and the status."""

from __future__ import annotations

from enum import StrEnum


class EpochKind(StrEnum):
    """What an epoch is for; written as its value in frames, manifests, logs and JSON."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"  # kept by retention
    FINAL = "final"  # the last epoch of a bounded job: committed, the job is over
    STOP = "stop"  # a savepoint the job stops at (an upgrade, a suspend): kept by retention

    @property
    def is_savepoint(self) -> bool:
        """Whether retention keeps it."""
        return self in (EpochKind.SAVEPOINT, EpochKind.STOP)


class EpochState(StrEnum):
    """The states an epoch passes through in the epoch log."""

    CREATED = "CREATED"
    DURABLE = "DURABLE"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"
