"""The `file` source and sink.

Source (REPLAYABLE): the files matching a glob, one split per file, each read to its
end as text lines or JSON lines, in batches of exactly `max_records` lines (the last
batch of a file may be shorter), so batch boundaries, and the watermarks emitted
after each batch, are the same on every run. Split `path` belongs to subtask
`stableHash(path) mod parallelism` (the plan's hash-mod policy). Cursor: the byte
offset of the next line (an exclusive cut). `snapshot` returns every split's cursor
and the enumerator state (discovered and finished files); `restore` resumes each
split at its cursor. With `discoveryIntervalMs` the source never ends and picks up
new files as they appear; files are taken as complete once visible.
WARNING: a file being read must not change. The snapshot keeps a hash of each split's
head; a restore whose unfinished split is shorter than its cursor, missing, or starts
with other bytes is refused naming the split (never skipped), and a file that shrinks
under a running job fails the run.

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
from nopstream.connectors.staged import ObjectSink, OutputConflict, SinkName
from nopstream.errors import RestoreRefused
from nopstream.model.connectors import FileSinkConfig, FileSourceConfig
from nopstream.plan.keys import stable_hash
from nopstream.records import Batch

_READ_HINT = 1 << 16
_HEAD = 4096  # bytes of a split's head hashed to tell a different file under the same name


class FileSource:
    """Reads the files of one source subtask."""

    def __init__(self, config: FileSourceConfig | dict[str, Any], *, subtask: int, parallelism: int) -> None:
        """Discover the files of this subtask."""
        c = FileSourceConfig.model_validate(config)
        self.pattern = c.path
        self.jsonl = c.format == "jsonl"
        self.discovery_ms = c.discovery_interval_ms
        self.subtask = subtask
        self.parallelism = parallelism
        self.cursors: dict[str, int] = {}
        self.finished: set[str] = set()
        self.heads: dict[str, tuple[int, str]] = {}  # split -> (bytes hashed, sha256 of them)
        self._queue: list[str] = []
        self._ahead: list[bytes] = []
        self._current: Any = None
        self._current_path: str | None = None
        self._last_discovery = 0.0
        self._discover()

    def _mine(self, path: str) -> bool:
        return stable_hash(path) % self.parallelism == self.subtask

    def _discover(self) -> None:
        self._last_discovery = time.monotonic()
        for path in sorted(glob.glob(self.pattern, recursive=True)):
            if Path(path).is_file() and path not in self.cursors and self._mine(path):
                self.cursors[path] = 0
                self._queue.append(path)

    def read(self, max_records: int) -> Batch | None:
        """Up to `max_records` lines of the current file (a few more may come at a buffer edge)."""
        while True:
            if self._current is None:
                due = (time.monotonic() - self._last_discovery) * 1000 >= (self.discovery_ms or 0)
                if not self._queue and self.discovery_ms is not None and due:
                    self._discover()
                if not self._queue:
                    return None if self.discovery_ms is None else Batch([])
                self._open(self._queue.pop(0))
            while len(self._ahead) < max_records:
                more = self._current.readlines(_READ_HINT)
                if not more:
                    break
                self._ahead.extend(more)
            if not self._ahead:
                assert self._current_path is not None
                size = os.fstat(self._current.fileno()).st_size
                if size < self.cursors[self._current_path]:
                    raise RuntimeError(
                        f"split '{self._current_path}' shrank to {size} bytes under a running job"
                        f" (its cursor is at byte {self.cursors[self._current_path]})"
                    )
                self._close_current(finished=True)
                continue
            lines, self._ahead = self._ahead[:max_records], self._ahead[max_records:]
            assert self._current_path is not None
            self.cursors[self._current_path] += sum(len(line) for line in lines)
            return Batch(line_format.decode(lines, jsonl=self.jsonl))

    def _open(self, path: str) -> None:
        self._current = open(path, "rb")  # noqa: SIM115 (kept open across reads)
        self._current.seek(self.cursors[path])
        self._current_path = path

    def _close_current(self, *, finished: bool) -> None:
        if self._current is not None:
            self._current.close()
            if finished and self._current_path is not None:
                self.finished.add(self._current_path)
        self._current = None
        self._current_path = None
        self._ahead = []

    def snapshot(self) -> dict[str, Any]:
        """Every split's cursor, the discovered and finished files, and the heads of splits begun."""
        for path, cursor in self.cursors.items():
            if cursor and path not in self.finished and path not in self.heads:
                n = min(cursor, _HEAD)
                self.heads[path] = (n, _head_hash(path, n))
        begun = {p: list(h) for p, h in self.heads.items() if p not in self.finished}
        return {"cursors": dict(self.cursors), "finished": sorted(self.finished), "heads": begun}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume every split at its cursor; finished files are not read again; RestoreRefused
        when an unfinished split changed under its cursor."""
        self._close_current(finished=False)
        self.cursors = {p: int(c) for p, c in state.get("cursors", {}).items() if self._mine(p)}
        self.finished = {p for p in state.get("finished", []) if self._mine(p)}
        self.heads = {
            p: (int(n), str(h)) for p, (n, h) in state.get("heads", {}).items() if p in self.cursors
        }
        for path, cursor in self.cursors.items():
            if cursor and path not in self.finished:
                _check_split(path, cursor, self.heads.get(path))
        self._queue = sorted(p for p in self.cursors if p not in self.finished)
        self._discover()

    def close(self) -> None:
        """Close the open file."""
        self._close_current(finished=False)


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


def _check_split(path: str, cursor: int, head: tuple[int, str] | None) -> None:
    """RestoreRefused naming the split when the file is not the one its cursor was taken in."""
    rule = "a file being read must not shrink or be replaced (docs/runtime.md)"
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise RestoreRefused(f"split '{path}' is gone, its cursor is at byte {cursor}: {rule}") from None
    if size < cursor:
        raise RestoreRefused(
            f"split '{path}' changed under its cursor: the file has {size} bytes, the cursor is at"
            f" byte {cursor}: {rule}"
        )
    if head is not None and _head_hash(path, head[0]) != head[1]:
        raise RestoreRefused(
            f"split '{path}' changed under its cursor: its first {head[0]} bytes differ: {rule}"
        )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
