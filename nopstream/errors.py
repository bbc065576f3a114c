"""The refusals of a run (each message names the object, the epoch or the split), shared by every layer."""

from __future__ import annotations


class StorageError(OSError):
    """Checkpoint storage could not be read or written."""


class RestoreRefused(RuntimeError):
    """A checkpoint cannot be restored: damaged, missing, or made for another plan."""


class StartRefused(RestoreRefused):
    """A run cannot start as configured (a sink's table is missing, say): no restart can fix it."""


class BadInput(StartRefused):
    """A record the job cannot take (not UTF-8, not JSON, too large): the same on every run, never
    retried; the message names the split, the byte offset and the rule."""


REFUSALS: dict[str, type[RestoreRefused]] = {
    "restore": RestoreRefused,
    "start": StartRefused,
    "input": BadInput,
}
"""Each kind of refusal by the name a task reports it under (`POST /failed`'s `refused`)."""


def refusal_kind(refused: RestoreRefused) -> str:
    """The name of the most specific kind `refused` is."""
    return next(kind for kind, cls in reversed(REFUSALS.items()) if isinstance(refused, cls))
