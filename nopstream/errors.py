"""The refusals of a run (each message names the object, the epoch or the split), shared by every layer."""

from __future__ import annotations

import sysconfig
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

_OURS = tuple({str(Path(__file__).parent), str(Path(__file__).resolve().parent)})
_LIBRARIES = tuple({sysconfig.get_paths()[p] for p in ("stdlib", "platstdlib", "purelib", "platlib")})


def shown_record(record: Any) -> str:
    """A record as the start of its JSON (at most 300 bytes), for a message that names it."""
    return orjson.dumps(record)[:300].decode("utf-8", errors="replace")


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


_EXIT_CODES = {"restore": 4, "start": 5, "input": 6}
REFUSED_EXITS = frozenset(_EXIT_CODES.values())
"""The exit codes of a task process that ended with a refusal: never recovered."""
TASK_LINE = "nopstream task: "
"""How the last line a refused task process writes on stderr begins."""


@dataclass(frozen=True)
class Refusal:
    """A task's refusal, the same in every run (never recovered), in each form it crosses a process
    in: its kind (a key of REFUSALS) and words; the JSON of `POST /failed`; the exit code and last
    line of a task process that ends with it."""

    kind: str
    message: str

    @classmethod
    def of(cls, refused: RestoreRefused) -> Refusal:
        """The refusal `refused` raised."""
        return cls(refusal_kind(refused), str(refused))

    def error(self, prefix: str = "") -> RestoreRefused:
        """The exception to raise for it, its message after `prefix` (who refused)."""
        return REFUSALS.get(self.kind, RestoreRefused)(prefix + self.message)

    @property
    def exit_code(self) -> int:
        """The exit code of a task process that ends with it."""
        return _EXIT_CODES.get(self.kind, _EXIT_CODES["restore"])

    @property
    def said(self) -> str:
        """What it says: `bad input: ...` or `cannot start: ...`."""
        return f"{'bad input' if self.kind == 'input' else 'cannot start'}: {self.message}"

    def line(self) -> str:
        """The last line a task process that ends with it writes on stderr."""
        return TASK_LINE + self.said

    @classmethod
    def from_exit(cls, code: int | None, last_line: str) -> Refusal | None:
        """The refusal a task process's exit code and last line report; None for another exit."""
        kind = next((k for k, c in _EXIT_CODES.items() if c == code), None)
        if kind is None:
            return None
        return cls(kind, last_line.removeprefix(TASK_LINE).partition(": ")[2])

    def to_json(self) -> dict[str, Any]:
        """Its part of `POST /failed`'s body."""
        return {"error": self.message, "refused": self.kind}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Refusal | None:
        """The refusal a `POST /failed` body reports; None for a plain failure."""
        kind = body.get("refused")
        return cls(str(kind), str(body.get("error", ""))) if kind else None


def failure_report(exc: BaseException) -> dict[str, Any]:
    """How a task tells its failure (the body of `POST /failed`, the dashboard's last failures).

    A refusal in its own words, with its kind; a user function's error in the line that names
    its operator and the user's frame; an error of the machine (an OSError: a full disk, no
    permission) in one line naming its file; anything else (ours) with the innermost frames
    of its traceback.
    """
    if isinstance(exc, RestoreRefused):
        return Refusal.of(exc).to_json()
    if isinstance(exc, OperatorFailed):
        return {"error": str(exc)}
    if isinstance(exc, OSError):
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": "".join(traceback.format_exception(exc, limit=-8))}
