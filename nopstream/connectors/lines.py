"""Records as lines, the way the file, s3 and stdout connectors read and write them.

Two formats: `jsonl` (one JSON value per line; blank lines skipped on reading) and
`text` (one string per line, without its line ending).
"""

from __future__ import annotations

from typing import Any

import orjson


def encode(records: list[Any], *, jsonl: bool) -> bytes:
    """The records as lines, each ended by a newline."""
    if jsonl:
        return b"".join(orjson.dumps(r) + b"\n" for r in records)
    return "".join(f"{r}\n" for r in records).encode("utf-8")


def decode(lines: list[bytes], *, jsonl: bool) -> list[Any]:
    """The records of whole lines (each with or without its line ending)."""
    if jsonl:
        return [orjson.loads(line) for line in lines if line.strip()]
    return [line.decode("utf-8").rstrip("\r\n") for line in lines]
