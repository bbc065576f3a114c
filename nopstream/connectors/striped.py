"""A striped source: one subtask's stripes of a set of objects (files, or S3 objects), as lines.

Every object is spread over the source's subtasks in stripes (`connectors.stripes`:
fixed 256 KiB cuts, each owned by one subtask by a hash of the object's name and the
stripe's number), so the subtasks share the work evenly however many objects there
are and whatever their sizes. A subtask reads its stripes in name order, in batches of
exactly `max_records` lines within a run of consecutive stripes (the last batch of a
run may be shorter), so batch boundaries, and the watermarks emitted after each batch,
are the same on every run. Each stripe is a split with its own event time
(`SplitEventTime`): a line belongs to the stripe it starts in, a record is judged late
against the highest timestamp of the lines before it in its own stripe, and the
subtask's watermark is held at the minimum until it has begun its last stripe (one
not begun may hold any timestamp), so what is late does not depend on how the stripes
are spread over subtasks. Cursor: the byte offset of the next line (an exclusive
cut). `snapshot` returns the cursor and event time of the stripe being read, the stripes
read to their end, and an identity of each object begun (`Objects.identity`: a hash of a
file's head, an object's ETag); `restore` takes every subtask's snapshot (a rescaled
job's too) and resumes the stripes this subtask owns.
WARNING: an object being read must not change. A restore whose begun stripe's object
is shorter than its cursor, missing, or another object under the same name is
refused naming the split (never skipped); one that shrinks under a running job fails
the run.
"""

from __future__ import annotations

import csv
import time
from itertools import accumulate, groupby
from typing import Any, BinaryIO, Protocol

from nopstream.connectors import lines as line_format
from nopstream.connectors import stripes
from nopstream.connectors.event_time import SplitHighs
from nopstream.connectors.lines import LineFormat
from nopstream.errors import BadInput, RestoreRefused
from nopstream.plan.keys import stable_hash
from nopstream.records import MIN_TIMESTAMP, Batch, Unreadable

_READ_HINT = 1 << 16


class Objects(Protocol):
    """Where a striped source's objects live, and how one is told from another under its name."""

    identity_field: str
    """The snapshot field that holds the identities of the objects begun."""

    def names(self) -> list[str]:
        """Every object visible now, in name order."""
        ...

    def open(self, name: str, identity: Any) -> BinaryIO:
        """An object opened for reading: seekable, buffered; RuntimeError when it is no longer
        `identity` (the identity it had when begun; None for one not begun)."""
        ...

    def size(self, name: str, handle: BinaryIO) -> int:
        """The object's size now (`handle` is the one `open` gave)."""
        ...

    def identity(self, name: str) -> Any:
        """Plain data that tells this object's content from another's under the same name."""
        ...

    def reading_to(self, name: str, end: int) -> None:
        """The reads of `name` that follow stop soon after offset `end` (a store fetches no further)."""
        ...

    def check(self, split: str, name: str, cursor: int | None, identity: Any) -> None:
        """RestoreRefused naming `split` when `name` is gone, shorter than `cursor` (a byte offset; None
        for a cursor that is not one), or not `identity`."""
        ...


class Discovery:
    """The objects a source subtask is yet to open, in the order found: listed at the start and, with
    `every_ms`, again that often once all are taken (the source then never ends)."""

    def __init__(self, objects: Objects, every_ms: int | None) -> None:
        self.objects = objects
        self.every_ms = every_ms
        self.queue: list[str] = []
        self._known: set[str] = set()
        self._listed_at = 0.0
        self.again()

    def again(self, finished: set[str] | None = None) -> None:
        """Forget what was found and list the objects now, leaving out the `finished` ones (a restore)."""
        self._known, self.queue = set(finished or ()), []
        self._list()

    def _list(self) -> None:
        self._listed_at = time.monotonic()
        for name in self.objects.names():
            if name not in self._known:
                self._known.add(name)
                self.queue.append(name)

    def next(self) -> str | None:
        """The next object to open (listing again first when due), or None when there is none now."""
        due = (time.monotonic() - self._listed_at) * 1000 >= (self.every_ms or 0)
        if not self.queue and self.every_ms is not None and due:
            self._list()
        return self.queue.pop(0) if self.queue else None

    def none_now(self) -> Batch | None:
        """What a read gives when no object is left to open: the end when listed once, else nothing yet."""
        return None if self.every_ms is None else Batch([])


def at_cursor(cursor: int | None) -> str:
    """The words a message about a split gives its cursor: none for a cursor that is not a byte."""
    return f", its cursor is at byte {cursor}" if cursor is not None else ""


class StripedSource:
    """Reads one source subtask's stripes of a set of objects."""

    def __init__(
        self,
        objects: Objects,
        *,
        lines: LineFormat,
        subtask: int,
        parallelism: int,
        discovery_ms: int | None = None,
        keep_unreadable: bool = False,
    ) -> None:
        """Discover the objects (again every `discovery_ms`, and then never end); with `keep_unreadable`
        a line that is not a record of the format is an `Unreadable` instead of a refusal."""
        self.objects = objects
        self.lines = lines
        self._fields: list[str] = []  # the header's field names of the object being read (CSV)
        self.keep_unreadable = keep_unreadable
        self.subtask = subtask
        self.parallelism = parallelism
        self.done: dict[str, set[int]] = {}  # object -> this subtask's stripes read to their end
        self.cursors: dict[str, int] = {}  # split id -> offset of its next line (the stretch being read)
        self.finished_objects: set[str] = set()  # read whole, as a checkpoint of one split per object says
        self.identities: dict[str, Any] = {}  # object -> its identity when begun
        self.event_times: SplitHighs[str] = SplitHighs()  # split id -> highest timestamp read in it
        self._hashes: dict[str, int] = {}
        self._ahead: list[bytes] = []
        self._current: BinaryIO | None = None
        self._current_name = ""
        self._stretches: list[stripes.Stretch] = []
        self._stretch: stripes.Stretch | None = None
        self._stretch_read = False  # every line of the stretch is in `_ahead` or handed out
        self._pos = 0  # offset of the next line to hand out
        self._marked = 0  # the stretch's stripes before this one are in `done`
        self._cursor_key: str | None = None
        self.discovery = Discovery(objects, discovery_ms)

    def _hash(self, name: str) -> int:
        h = self._hashes.get(name)
        if h is None:
            h = self._hashes[name] = stable_hash(name)
        return h

    def _mine(self, name: str, stripe: int) -> bool:
        return stripes.owner(self._hash(name), stripe, self.parallelism) == self.subtask

    def read(self, max_records: int) -> Batch | None:
        """Up to `max_records` lines of the stretch being read (a few more may come at a buffer edge)."""
        while True:
            if self._current is None:
                name = self.discovery.next()
                if name is None:
                    return self.discovery.none_now()
                self._open(name)
                continue
            if self._stretch is None:
                if not self._stretches:
                    self._close_current()
                    continue
                self._begin(self._stretches.pop(0))
            while len(self._ahead) < max_records and not self._stretch_read:
                self._read_ahead()
            if not self._ahead:
                self._end_stretch()
                continue
            lines, self._ahead = self._ahead[:max_records], self._ahead[max_records:]
            start = self._pos
            self._advance(sum(map(len, lines)))
            if start == 0 and self.lines.has_header:  # the header: the stripe 0 owner's first line
                start, lines = len(lines[0]), lines[1:]
            self._note_stripes(lines, start)
            return self._decode(lines, start)

    def _decode(self, lines: list[bytes], start: int) -> Batch:
        """The records of `lines`, read from byte `start` of the object; a bad line is refused (or,
        keeping unreadable ones, an `Unreadable` naming its split and byte)."""

        def unreadable(index: int, line: bytes, reason: str) -> Unreadable:
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            return Unreadable(text, str(self._bad_line(start + sum(map(len, lines[:index])), reason)))

        keep = unreadable if self.keep_unreadable else None
        try:
            return Batch(self.lines.decode(lines, fields=self._fields, unreadable=keep))
        except line_format.BadLine as bad:
            raise self._bad_line(start + sum(map(len, lines[: bad.index])), bad.reason) from None

    def _note_stripes(self, lines: list[bytes], start: int) -> None:
        """Note the stripe of each line handed out (the one it starts in), for `split_highs`."""
        name, size, times = self._current_name, stripes.STRIPE_BYTES, self.event_times
        times.start()
        if not lines:
            return
        if start // size == (start + sum(map(len, lines[:-1]))) // size:  # the usual case: one stripe
            times.note(stripes.split_id(name, start // size), len(lines))
            return
        starts = accumulate(map(len, lines[:-1]), initial=start)
        for stripe, group in groupby(starts, key=lambda offset: offset // size):
            times.note(stripes.split_id(name, stripe), sum(1 for _ in group))

    def split_highs(self, timestamps: list[int]) -> list[int]:
        """Each record's stripe high before it (`SplitEventTime`)."""
        times = self.event_times
        highs = times.highs_before(timestamps)
        if len(times.highs) > 1:  # the stripes read to their end hold no event time back any more
            times.highs = {k: t for k, t in times.highs.items() if k in self.cursors}
        return highs

    def event_time_floor(self) -> int | None:
        """The stripe being read's high once it is this subtask's last (MIN_TIMESTAMP before: a stripe
        not begun may hold any timestamp); None when none is being read (`SplitEventTime`)."""
        if self.discovery.queue or self._stretches:
            return MIN_TIMESTAMP
        if self._stretch is None:
            return None
        stripe = self._pos // stripes.STRIPE_BYTES
        if stripe < self._stretch.end - 1:
            return MIN_TIMESTAMP
        return self.event_times.highs.get(stripes.split_id(self._current_name, stripe), MIN_TIMESTAMP)

    def _bad_line(self, offset: int, reason: str) -> BadInput:
        """The refusal of the line at byte `offset` of the object being read."""
        split = stripes.split_id(self._current_name, offset // stripes.STRIPE_BYTES)
        return BadInput(
            f"split '{split}' of '{self._current_name}': the line at byte {offset} {reason}"
            f" (rule: a source of format {self.lines.format} reads {self.lines.form})"
        )

    def _open(self, name: str) -> None:
        """Open an object and plan the stretches of this subtask's unread stripes in it."""
        self._current = self.objects.open(name, self.identities.get(name))
        self._current_name = name
        if self.lines.has_header:
            self._current.seek(0)
            self._fields = self._header_fields(self._current.readline())
        size = self.objects.size(name, self._current)
        done = self.done.get(name, set())
        mine = [k for k in range(stripes.count(size)) if self._mine(name, k) and k not in done]
        begun = {}
        for k in mine:
            cursor = self.cursors.get(stripes.split_id(name, k))
            if cursor is not None:
                begun[k] = cursor
        self._stretches = stripes.stretches(mine, begun)

    def _header_fields(self, header: bytes) -> list[str]:
        """The field names of the object's header line; BadInput when it is not a CSV line."""
        try:
            return self.lines.fields(header)
        except (ValueError, csv.Error) as err:
            raise self._bad_line(0, f"is not a CSV header ({err})") from None

    def _begin(self, stretch: stripes.Stretch) -> None:
        """Go to the first line of a stretch: its cursor, or the first line starting in its first stripe."""
        f = self._current
        assert f is not None
        self.objects.reading_to(self._current_name, stretch.end_offset)
        if stretch.resume is not None:
            f.seek(stretch.resume)
        elif stretch.first:
            f.seek(stretch.first * stripes.STRIPE_BYTES - 1)
            f.readline()  # the rest of the line that starts before the stripe: its owner reads it
        else:
            f.seek(0)
        self._stretch, self._stretch_read, self._pos = stretch, False, f.tell()
        self._marked = stretch.first
        self._advance(0)

    def _read_ahead(self) -> None:
        """Buffer more whole lines of the stretch: none that starts at or after its end."""
        assert self._stretch is not None and self._current is not None
        f, end = self._current, self._stretch.end_offset
        # up to the stretch's end: lines past it would be split into objects only to be dropped
        more = f.readlines(max(1, min(_READ_HINT, end - f.tell())))
        if not more:
            self._stretch_read = True
            return
        after = f.tell()
        if after > end:  # the stretch ends in this chunk: keep the lines that start before it
            start = after - sum(map(len, more))
            for i, line in enumerate(more):
                if start >= end:
                    more = more[:i]
                    f.seek(start)
                    self._stretch_read = True
                    break
                start += len(line)
        self._ahead.extend(more)

    def _advance(self, nbytes: int) -> None:
        """`nbytes` of lines handed out: the stripes passed are done, the cursor is the next line's."""
        assert self._stretch is not None
        name, stretch = self._current_name, self._stretch
        self._pos += nbytes
        at = self._pos // stripes.STRIPE_BYTES
        self._mark_done(min(at, stretch.end))
        self._drop_cursor()
        if self._pos < stretch.end_offset:
            self._cursor_key = stripes.split_id(name, at)
            self.cursors[self._cursor_key] = self._pos

    def _end_stretch(self) -> None:
        """Every line of the stretch was handed out: its stripes are done (the object must not shrink)."""
        assert self._stretch is not None and self._current is not None
        size = self.objects.size(self._current_name, self._current)
        if size < self._pos:
            raise RuntimeError(
                f"split '{stripes.split_id(self._current_name, self._pos // stripes.STRIPE_BYTES)}' of"
                f" '{self._current_name}' shrank to {size} bytes under a running job (its cursor"
                f" is at byte {self._pos})"
            )
        self._mark_done(self._stretch.end)
        self._drop_cursor()
        self._stretch = None

    def _mark_done(self, upto: int) -> None:
        """The stretch's stripes before `upto` are read to their end (each marked once, not per batch)."""
        if upto > self._marked:
            self.done.setdefault(self._current_name, set()).update(range(self._marked, upto))
            self._marked = upto

    def _drop_cursor(self) -> None:
        if self._cursor_key is not None:
            del self.cursors[self._cursor_key]
            self._cursor_key = None

    def _close_current(self) -> None:
        if self._current is not None:
            self._current.close()
        self._current = None
        self._stretch = None
        self._stretches = []
        self._ahead = []
        self._cursor_key = None

    def snapshot(self) -> dict[str, Any]:
        """The cursor of the stripe being read, the stripes done, and the identities of the objects begun."""
        begun = {stripes.parse_split_id(split)[0] for split in self.cursors}
        for name in begun - self.identities.keys():
            self.identities[name] = self.objects.identity(name)
        return {
            "stripeBytes": stripes.STRIPE_BYTES,
            "cursors": dict(self.cursors),
            "eventTimes": {k: t for k, t in self.event_times.highs.items() if k in self.cursors},
            # keyed by subtask: a restore joins every subtask's snapshot, and each names its own stripes
            "done": {str(self.subtask): {p: sorted(ks) for p, ks in sorted(self.done.items()) if ks}},
            "finished": sorted(self.finished_objects),
            self.objects.identity_field: {p: i for p, i in self.identities.items() if p in begun},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Resume this subtask's stripes from the snapshots of every subtask (of any parallelism);
        RestoreRefused when a begun stripe's object changed under its cursor, or the checkpoint read
        the objects as Parquet."""
        if "rowGroups" in state:
            raise RestoreRefused(
                "the source's checkpoint read its objects as Parquet; this source reads lines: start over"
                " with --fresh"
            )
        self._close_current()
        done, begun = _progress(state)
        self.finished_objects = set(state.get("finished", []))
        self.done = {p: {k for k in ks if self._mine(p, k)} for p, ks in done.items()}
        self.cursors = {
            stripes.split_id(p, k): c
            for (p, k), c in begun.items()
            if self._mine(p, k) and k not in done.get(p, ())
        }
        times = state.get("eventTimes", {})
        self.event_times.highs = {k: int(times[k]) for k in self.cursors if k in times}
        self.identities = dict(state.get(self.objects.identity_field, {}))
        for split, cursor in self.cursors.items():
            name = stripes.parse_split_id(split)[0]
            self.objects.check(split, name, cursor, self.identities.get(name))
        self.discovery.again(self.finished_objects)

    def close(self) -> None:
        """Close the open object."""
        self._close_current()


def _progress(state: dict[str, Any]) -> tuple[dict[str, set[int]], dict[tuple[str, int], int]]:
    """Every subtask's stripes done, per object, and the cursors of the stripes begun, from a joined snapshot.

    A snapshot without `stripeBytes` was taken when an object was one split read by one
    subtask, its cursor keyed by its name: the stripes before its cursor are done, and
    the stripe it points into resumes there.
    """
    size = state.get("stripeBytes")
    if size is None:
        done: dict[str, set[int]] = {}
        begun: dict[tuple[str, int], int] = {}
        finished = set(state.get("finished", []))
        for name, cursor in state.get("cursors", {}).items():
            if cursor and name not in finished:
                done[name] = set(range(cursor // stripes.STRIPE_BYTES))
                begun[(name, cursor // stripes.STRIPE_BYTES)] = cursor
        return done, begun
    if size != stripes.STRIPE_BYTES:
        raise RestoreRefused(
            f"the source's checkpoint cuts its input into stripes of {size} bytes; this version of"
            f" nopstream reads stripes of {stripes.STRIPE_BYTES} bytes: start over with --fresh"
        )
    return stripes.joined_progress(state)
