"""Errors of the model layer: every problem found in user input, reported at once.

An `Issue` names the path of the offending field, what is wrong, and the rule it
breaks; a `ModelError` carries all the issues of one input.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Issue:
    """One problem in user input: where (field path), what, and which rule."""

    path: str
    message: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} (rule: {self.rule})"


class ModelError(Exception):
    """Raised when user input breaks one or more rules; carries every issue found."""

    def __init__(self, issues: Iterable[Issue]) -> None:
        self.issues: tuple[Issue, ...] = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


def format_path(parts: Sequence[str | int]) -> str:
    """Render a field path the way a person writes it: `spec.model.operators[2].inputs[0]`."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out
