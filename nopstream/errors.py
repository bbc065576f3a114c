"""The refusals of a run (each message names the object, the epoch or the split), shared by every layer."""

from __future__ import annotations

import traceback
from typing import Any


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


def failure_report(exc: BaseException) -> dict[str, Any]:
    """How a task tells its failure (the body of `POST /failed`, the dashboard's last failures).

    A refusal in its own words, with its kind; an error of the machine (an OSError: a full
    disk, no permission) in one line naming its file; anything else with the innermost
    frames of its traceback, where the user's own code raised.
    """
    if isinstance(exc, RestoreRefused):
        return {"error": str(exc), "refused": refusal_kind(exc)}
    if isinstance(exc, OSError):
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": "".join(traceback.format_exception(exc, limit=-8))}
