"""Stripes: how the file and s3 sources spread the bytes of every file (or object) over their subtasks.

A file is cut at fixed offsets into stripes of `STRIPE_BYTES`; stripe k of `path`
belongs to subtask `(stableHash(path) + k) mod parallelism`. So every subtask reads
about 1/parallelism of every file, whatever the number and the sizes of the files,
and who owns a stripe depends on nothing but the path and the offset: no subtask
needs another's listing of the files, and ownership never moves while a file is read.
A line belongs to the stripe its first byte is in (as Hadoop's line splits): a reader
starting a stripe other than a file's first skips to the first line that starts at
or after the stripe's start, and reads through the line that crosses the stripe's end.

A reader reads its stripes of a file in order, a run of consecutive stripes as one
stretch (at parallelism 1 a whole file is one stretch, read as if there were no
stripes). Its progress: the stripes it read to their end (`done`) and, for the
stretch it is in, the offset of the next line (a cursor, keyed by the stripe that
line starts in: `{path}#{stripe}`).
WARNING: changing `STRIPE_BYTES` or the owner rule moves lines between subtasks; a
checkpoint records the stripe size and a restore under another is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STRIPE_BYTES = 1 << 18


def owner(path_hash: int, stripe: int, parallelism: int) -> int:
    """The subtask that reads stripe `stripe` of the file whose path hashes to `path_hash`."""
    return (path_hash + stripe) % parallelism


def split_id(path: str, stripe: int) -> str:
    """The id of a stripe of a file, as its cursor is keyed in a snapshot."""
    return f"{path}#{stripe}"


def parse_split_id(split: str) -> tuple[str, int]:
    """The file and stripe of a split id; ValueError when it is not one."""
    path, sep, stripe = split.rpartition("#")
    if not sep or not stripe.isdigit():
        raise ValueError(f"'{split}' is not a file stripe ('{{path}}#{{stripe}}')")
    return path, int(stripe)


def joined_progress(state: dict[str, Any]) -> tuple[dict[str, set[int]], dict[tuple[str, int], int]]:
    """From a snapshot joined over subtasks (`done` keyed by subtask, then object; `cursors` by split
    id): every split done, per object, and the cursor of each split begun, by (object, split)."""
    done: dict[str, set[int]] = {}
    for per_subtask in state.get("done", {}).values():
        for name, splits in per_subtask.items():
            done.setdefault(name, set()).update(splits)
    begun = {parse_split_id(split): int(cursor) for split, cursor in state.get("cursors", {}).items()}
    return done, begun


def count(size: int) -> int:
    """How many stripes a file of `size` bytes has."""
    return -(-size // STRIPE_BYTES)


@dataclass(frozen=True)
class Stretch:
    """Consecutive stripes [first, end) that one reader reads in one go, from `resume` if it had begun."""

    first: int
    end: int
    resume: int | None = None

    @property
    def end_offset(self) -> int:
        """The offset past the last byte of its last stripe: lines starting before it are its own."""
        return self.end * STRIPE_BYTES


def stretches(mine: list[int], begun: dict[int, int]) -> list[Stretch]:
    """The stretches covering `mine` (a reader's unread stripes of a file, ascending).

    A stretch ends where the stripes stop being consecutive, and before a begun stripe
    (one with a cursor in `begun`): that stripe starts its own stretch at its cursor.
    """
    out: list[Stretch] = []
    for stripe in mine:
        last = out[-1] if out else None
        if last is not None and last.end == stripe and stripe not in begun:
            out[-1] = Stretch(last.first, stripe + 1, last.resume)
        else:
            out.append(Stretch(stripe, stripe + 1, begun.get(stripe)))
    return out
