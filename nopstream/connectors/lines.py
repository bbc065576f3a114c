"""Records as lines, the way the file, s3 and stdout connectors read and write them.

Two formats: `jsonl` (one JSON value per line; blank lines skipped on reading) and
`text` (one string per line, without its line ending).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson


def encode(records: list[Any], *, jsonl: bool) -> bytes:
    """The records as lines, each ended by a newline."""
    if jsonl:
        return b"".join(orjson.dumps(r) + b"\n" for r in records)
    return "".join(f"{r}\n" for r in records).encode("utf-8")


class BadLine(ValueError):
    """Line `index` of the lines given is not a record of the format; `reason` says why."""

    def __init__(self, index: int, reason: str) -> None:
        """Line `index` (0-based) is bad for `reason`."""
        super().__init__(f"line {index}: {reason}")
        self.index = index
        self.reason = reason


def decode(
    lines: list[bytes], *, jsonl: bool, unreadable: Callable[[int, bytes, str], Any] | None = None
) -> list[Any]:
    """The records of whole lines (each with or without its line ending); BadLine naming the first bad
    one, or, given `unreadable`, `unreadable(index, line, reason)` in place of each bad one."""
    try:
        if jsonl:
            return [orjson.loads(line) for line in lines if line.strip()]
        return [line.decode("utf-8").rstrip("\r\n") for line in lines]
    except ValueError:  # found again line by line, off the fast path
        records = []
        for i, line in enumerate(lines):
            try:
                if not jsonl:
                    records.append(line.decode("utf-8").rstrip("\r\n"))
                elif line.strip():
                    records.append(orjson.loads(line))
            except UnicodeDecodeError as err:
                why = f"is not UTF-8 ({err.reason} at byte {err.start} of the line)"
            except orjson.JSONDecodeError as err:
                why = f"is not JSON ({err})"
            else:
                continue
            if unreadable is None:
                raise BadLine(i, why) from None
            records.append(unreadable(i, line, why))
        return records
