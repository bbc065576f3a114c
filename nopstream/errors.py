"""The refusals of a run (each message names the object, the epoch or the split), shared by every layer."""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path
from typing import Any

_OURS = tuple({str(Path(__file__).parent), str(Path(__file__).resolve().parent)})
_LIBRARIES = tuple({sysconfig.get_paths()[p] for p in ("stdlib", "platstdlib", "purelib", "platlib")})


class StorageError(OSError):
    """Checkpoint storage could not be read or written."""


class RestoreRefused(RuntimeError):
    """A checkpoint cannot be restored: damaged, missing, or made for another plan."""


class StartRefused(RestoreRefused):
    """A run cannot start as configured (a sink's table is missing, say): no restart can fix it."""


class BadInput(StartRefused):
    """A record the job cannot take (not UTF-8, not JSON, too large): the same on every run, never
    retried; the message names the split, the byte offset and the rule."""


class OperatorFailed(RuntimeError):
    """An operator's function (or key selector, or timestamp) raised: the message names the operator,
    the error and the user's frame; the error itself is its `__cause__`."""

    @classmethod
    def of(cls, what: str, exc: BaseException) -> OperatorFailed:
        """`what` (`operator 'id' (type)`) failed with `exc` (raise it `from exc`)."""
        return cls(f"{what} failed: {describe(exc)}")


def user_frame(exc: BaseException) -> str | None:
    """Where the user's code raised `exc`: `file:line in function` of the innermost frame of its
    traceback outside nopstream, the standard library and installed packages (else the innermost
    outside nopstream); None when every frame is ours."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_OURS)]
    own = [f for f in frames if not f.filename.startswith(_LIBRARIES)]
    chosen = (own or frames)[-1:]
    return f"{chosen[0].filename}:{chosen[0].lineno} in {chosen[0].name}" if chosen else None


def error_text(exc: BaseException) -> str:
    """`Type: message` (the type alone when the message is empty), as Python's last traceback line."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def describe(exc: BaseException) -> str:
    """One line for a user's error: `Type: message at file:line in function`."""
    where = user_frame(exc)
    return f"{error_text(exc)} at {where}" if where else error_text(exc)


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

    A refusal in its own words, with its kind; a user function's error in the line that names
    its operator and the user's frame; an error of the machine (an OSError: a full disk, no
    permission) in one line naming its file; anything else (ours) with the innermost frames
    of its traceback.
    """
    if isinstance(exc, RestoreRefused):
        return {"error": str(exc), "refused": refusal_kind(exc)}
    if isinstance(exc, OperatorFailed):
        return {"error": str(exc)}
    if isinstance(exc, OSError):
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": "".join(traceback.format_exception(exc, limit=-8))}
