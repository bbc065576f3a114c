"""User functions of the Python API's tests (importable by name, as task processes need)."""

from __future__ import annotations

from typing import Any


def split(line: str) -> list[str]:
    return line.split()


def word(record: str) -> str:
    return record


def key(record: dict[str, Any]) -> str:
    return record["key"]


def refuse_seven(record: int) -> int:
    if record == 7:
        raise ValueError("seven is not taken")
    return record
