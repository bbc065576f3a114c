"""The `file` source and sink.

Source (REPLAYABLE): the files matching a glob, read as text lines or JSON lines.
Every file is spread over the source's subtasks in stripes (`connectors.stripes`:
fixed 256 KiB cuts, each owned by one subtask by a hash of the path and the stripe's
number), so the subtasks share the work evenly however many files there are and
whatever their sizes. A subtask reads its stripes in file order, in batches of
exactly `max_records` lines within a run of consecutive stripes (the last batch of a
run may be shorter), so batch boundaries, and the watermarks emitted after each
batch, are the same on every run. Cursor: the byte offset of the next line (an
exclusive cut). `snapshot` returns the cursor of the stripe being read, the stripes
read to their end, and a hash of the head of each file begun; `restore` takes every
subtask's snapshot (a rescaled job's too) and resumes the stripes this subtask owns.
With `discoveryIntervalMs` the source never ends and picks up new files as they
appear; files are taken as complete once visible.
WARNING: a file being read must not change. A restore whose begun stripe's file is
shorter than its cursor, missing, or starts with other bytes is refused naming the
split (never skipped), and a file that shrinks under a running job fails the run.

Sink (STAGED_ATOMIC_COMMIT): per sink subtask, one staged file per epoch, linked
into place when the epoch is committed, never over another file (see `FileSink`).
"""

from __future__ import annotations

import glob
import hashlib
import os
import time
from pathlib import Path
from typing import Any

from nopstream.connectors import lines as line_format
from nopstream.connectors import stripes
from nopstream.connectors.staged import ObjectSink, OutputConflict, SinkName
from nopstream.errors import RestoreRefused
from nopstream.model.connectors import FileSinkConfig, FileSourceConfig
from nopstream.plan.keys import stable_hash
from nopstream.records import Batch

_READ_HINT = 1 << 16
_HEAD = 4096  # bytes of a file's head hashed to tell a different file under the same name


class FileSource:
    """Reads one source subtask's stripes of the files."""

    def __init__(self, config: FileSourceConfig | dict[str, Any], *, subtask: int, parallelism: int) -> None:
        """Discover the files."""
        c = FileSourceConfig.model_validate(config)
        self.pattern = c.path
        self.jsonl = c.format == "jsonl"
        self.discovery_ms = c.discovery_interval_ms
        self.subtask = subtask
        self.parallelism = parallelism
        self.done: dict[str, set[int]] = {}  # file -> this subtask's stripes read to their end
        self.cursors: dict[str, int] = {}  # split id -> offset of its next line (the stretch being read)
        self.finished_files: set[str] = set()  # read whole, as a checkpoint of one split per file says
        self.heads: dict[str, tuple[int, str]] = {}  # file -> (bytes hashed, sha256 of them)
        self._hashes: dict[str, int] = {}
        self._known: set[str] = set()
        self._queue: list[str] = []
        self._ahead: list[bytes] = []
        self._current: Any = None
        self._current_path = ""
        self._stretches: list[stripes.Stretch] = []
        self._stretch: stripes.Stretch | None = None
        self._stretch_read = False  # every line of the stretch is in `_ahead` or handed out
        self._pos = 0  # offset of the next line to hand out
        self._marked = 0  # the stretch's stripes before this one are in `done`
        self._cursor_key: str | None = None
        self._last_discovery = 0.0
        self._discover()

    def _hash(self, path: str) -> int:
        h = self._hashes.get(path)
        if h is None:
            h = self._hashes[path] = stable_hash(path)
        return h

    def _mine(self, path: str, stripe: int) -> bool:
        return stripes.owner(self._hash(path), stripe, self.parallelism) == self.subtask

    def _discover(self) -> None:
        self._last_discovery = time.monotonic()
        for path in sorted(glob.glob(self.pattern, recursive=True)):
            if path not in self._known and path not in self.finished_files and Path(path).is_file():
                self._known.add(path)
                self._queue.append(path)

    def read(self, max_records: int) -> Batch | None:
        """Up to `max_records` lines of the stretch being read (a few more may come at a buffer edge)."""
        while True:
            if self._current is None:
                due = (time.monotonic() - self._last_discovery) * 1000 >= (self.discovery_ms or 0)
                if not self._queue and self.discovery_ms is not None and due:
                    self._discover()
                if not self._queue:
                    return None if self.discovery_ms is None else Batch([])
                self._open(self._queue.pop(0))
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
            self._advance(sum(map(len, lines)))
            return Batch(line_format.decode(lines, jsonl=self.jsonl))

    def _open(self, path: str) -> None:
        """Open a file and plan the stretches of this subtask's unread stripes in it."""
        self._current = open(path, "rb")  # noqa: SIM115 (kept open across reads)
        self._current_path = path
        size = os.fstat(self._current.fileno()).st_size
        done = self.done.get(path, set())
        mine = [k for k in range(stripes.count(size)) if self._mine(path, k) and k not in done]
        begun = {}
        for k in mine:
            cursor = self.cursors.get(stripes.split_id(path, k))
            if cursor is not None:
                begun[k] = cursor
        self._stretches = stripes.stretches(mine, begun)

    def _begin(self, stretch: stripes.Stretch) -> None:
        """Go to the first line of a stretch: its cursor, or the first line starting in its first stripe."""
        f = self._current
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
        assert self._stretch is not None
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
        path, stretch = self._current_path, self._stretch
        self._pos += nbytes
        at = self._pos // stripes.STRIPE_BYTES
        self._mark_done(min(at, stretch.end))
        self._drop_cursor()
        if self._pos < stretch.end_offset:
            self._cursor_key = stripes.split_id(path, at)
            self.cursors[self._cursor_key] = self._pos

    def _end_stretch(self) -> None:
        """Every line of the stretch was handed out: its stripes are done (the file must not have shrunk)."""
        assert self._stretch is not None
        size = os.fstat(self._current.fileno()).st_size
        if size < self._pos:
            raise RuntimeError(
                f"split '{stripes.split_id(self._current_path, self._pos // stripes.STRIPE_BYTES)}' of"
                f" file '{self._current_path}' shrank to {size} bytes under a running job (its cursor"
                f" is at byte {self._pos})"
            )
        self._mark_done(self._stretch.end)
        self._drop_cursor()
        self._stretch = None

    def _mark_done(self, upto: int) -> None:
        """The stretch's stripes before `upto` are read to their end (each marked once, not per batch)."""
        if upto > self._marked:
            self.done.setdefault(self._current_path, set()).update(range(self._marked, upto))
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
        """The cursor of the stripe being read, the stripes done, and the heads of the files begun."""
        begun = {stripes.parse_split_id(split)[0] for split in self.cursors}
        for path in begun - self.heads.keys():
            n = min(os.stat(path).st_size, _HEAD)
            self.heads[path] = (n, _head_hash(path, n))
        return {
            "stripeBytes": stripes.STRIPE_BYTES,
            "cursors": dict(self.cursors),
            # keyed by subtask: a restore joins every subtask's snapshot, and each names its own stripes
            "done": {str(self.subtask): {p: sorted(ks) for p, ks in sorted(self.done.items()) if ks}},
            "finished": sorted(self.finished_files),
            "heads": {p: list(h) for p, h in self.heads.items() if p in begun},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Resume this subtask's stripes from the snapshots of every subtask (of any parallelism);
        RestoreRefused when a begun stripe's file changed under its cursor."""
        self._close_current()
        done, begun = _progress(state)
        self.finished_files = set(state.get("finished", []))
        self.done = {p: {k for k in ks if self._mine(p, k)} for p, ks in done.items()}
        self.cursors = {
            stripes.split_id(p, k): c
            for (p, k), c in begun.items()
            if self._mine(p, k) and k not in done.get(p, ())
        }
        self.heads = {p: (int(n), str(h)) for p, (n, h) in state.get("heads", {}).items()}
        for split, cursor in self.cursors.items():
            path = stripes.parse_split_id(split)[0]
            _check_split(split, path, cursor, self.heads.get(path))
        self._known, self._queue = set(), []
        self._discover()

    def close(self) -> None:
        """Close the open file."""
        self._close_current()


def _progress(state: dict[str, Any]) -> tuple[dict[str, set[int]], dict[tuple[str, int], int]]:
    """Every subtask's stripes done, per file, and the cursors of the stripes begun, from a joined snapshot.

    A snapshot without `stripeBytes` was taken when a file was one split read by one
    subtask, its cursor keyed by the path: the stripes before its cursor are done, and
    the stripe it points into resumes there.
    """
    done: dict[str, set[int]] = {}
    begun: dict[tuple[str, int], int] = {}
    size = state.get("stripeBytes")
    if size is None:
        finished = set(state.get("finished", []))
        for path, cursor in state.get("cursors", {}).items():
            if cursor and path not in finished:
                done[path] = set(range(cursor // stripes.STRIPE_BYTES))
                begun[(path, cursor // stripes.STRIPE_BYTES)] = cursor
        return done, begun
    if size != stripes.STRIPE_BYTES:
        raise RestoreRefused(
            f"the file source's checkpoint cuts files into stripes of {size} bytes; this version of"
            f" nopstream reads stripes of {stripes.STRIPE_BYTES} bytes: start over with --fresh"
        )
    for per_subtask in state.get("done", {}).values():
        for path, ks in per_subtask.items():
            done.setdefault(path, set()).update(ks)
    for split, cursor in state.get("cursors", {}).items():
        begun[stripes.parse_split_id(split)] = int(cursor)
    return done, begun


class FileSink(ObjectSink):
    """Writes a sink subtask's records in transactions, one per epoch (STAGED_ATOMIC_COMMIT).

    Transaction N goes to the staged file `{path}/.staging/{object}`, created fresh at
    its first record, flushed and fsynced at barrier N; committing links it to
    `{path}/{object}` and removes the staged name (atomic; a link never replaces an
    existing file, so a committed file that is not this transaction's is never
    overwritten). Object names and bookkeeping: `staged.ObjectSink`.
    """

    def __init__(self, config: FileSinkConfig | dict[str, Any], *, name: SinkName) -> None:
        """Prepare the output and staging directories."""
        c = FileSinkConfig.model_validate(config)
        self.ext = "jsonl" if c.format == "jsonl" else "txt"
        super().__init__(name)
        self.dir = Path(c.path)
        self.staging = self.dir / ".staging"
        self.staging.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.ext == "jsonl"
        self._file: Any = None
        self._file_epoch = 0  # the epoch the open transaction's staged file is named for
        self._created = 0  # the last epoch whose staged file this process created

    def _staged(self, epoch: int) -> Path:
        return self.staging / self._object(epoch)

    def write(self, batch: Batch) -> None:
        """Append the batch to the open transaction's staged file (created fresh for a new one)."""
        if self._file is None:
            fresh = self._created != self.epoch
            self._file = open(self._staged(self.epoch), "wb" if fresh else "ab")  # noqa: SIM115 (open until pre-commit)
            self._file_epoch = self._created = self.epoch
        self._file.write(line_format.encode(batch.records, jsonl=self.jsonl))
        self.records += len(batch.records)

    def _release(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def _stage(self, epoch: int) -> None:
        """The staged file was fsynced by `_release`; name it for `epoch` if it was opened for another.

        Epoch numbers may skip after a recovery (a run numbers its epochs past every
        epoch in storage), so the barrier that closes a transaction can carry a higher
        number than the one its file was opened under.
        """
        if self._file_epoch != epoch:
            os.replace(self._staged(self._file_epoch), self._staged(epoch))
            _fsync_dir(self.staging)

    def _publish(self, epoch: int, lineage: int) -> None:
        staged, final = self.staging / self._object(epoch, lineage), self.dir / self._object(epoch, lineage)
        try:
            os.link(staged, final)
        except FileExistsError:
            if not staged.exists():
                return  # published before
            if not os.path.samefile(staged, final):
                raise OutputConflict(
                    f"refusing to replace committed output {final}: it is not transaction"
                    f" {self.txn_prefix}:{epoch}"
                ) from None
        except FileNotFoundError:
            if final.exists():
                return  # published before
            raise OutputConflict(
                f"transaction {self.txn_prefix}:{epoch} has no staged file {staged}"
            ) from None
        _fsync_dir(self.dir)
        staged.unlink()
        _fsync_dir(self.staging)

    def _staged_names(self) -> list[str]:
        return os.listdir(self.staging)

    def _committed_names(self) -> list[str]:
        return os.listdir(self.dir)

    def _drop_staged(self, name: str) -> None:
        (self.staging / name).unlink(missing_ok=True)

    def _location(self, name: str) -> str:
        return str((self.dir / name).resolve())

    def finish(self) -> None:
        """End of input: write the staged file out (its records wait for the final epoch)."""
        self._release()


def committed_records(config: FileSinkConfig | dict[str, Any]) -> list[Any]:
    """Every record committed in a file sink's directory, decoded (`nopstream chaos`)."""
    c = FileSinkConfig.model_validate(config)
    directory = Path(c.path)
    paths = sorted(p for p in directory.iterdir() if p.is_file()) if directory.is_dir() else []
    jsonl = c.format == "jsonl"
    return [r for p in paths for r in line_format.decode(p.read_bytes().splitlines(), jsonl=jsonl)]


def _head_hash(path: str, n: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(n)).hexdigest()


def _check_split(split: str, path: str, cursor: int, head: tuple[int, str] | None) -> None:
    """RestoreRefused naming the split when its file is not the one its cursor was taken in."""
    rule = "a file being read must not shrink or be replaced (docs/runtime.md)"
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise RestoreRefused(f"split '{split}' is gone, its cursor is at byte {cursor}: {rule}") from None
    if size < cursor:
        raise RestoreRefused(
            f"split '{split}' changed under its cursor: the file has {size} bytes, the cursor is at"
            f" byte {cursor}: {rule}"
        )
    if head is not None and _head_hash(path, head[0]) != head[1]:
        raise RestoreRefused(
            f"split '{split}' changed under its cursor: its file's first {head[0]} bytes differ: {rule}"
        )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
