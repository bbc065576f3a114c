"""The `file` source and sink.

Source (REPLAYABLE): the files matching a glob, read as text, JSON or CSV lines,
each spread over the source's subtasks in stripes (`connectors.striped`); a file
begun is told from another under its path by a hash of its first 4 KiB. With
`discoveryIntervalMs` the source never ends and picks up new files as they appear;
files are taken as complete once visible.
WARNING: a file being read must not change. A restore whose begun stripe's file is
shorter than its cursor, missing, or starts with other bytes is refused naming the
split (never skipped), and a file that shrinks under a running job fails the run.

Sink (STAGED_ATOMIC_COMMIT): per sink subtask, one staged file per epoch, linked
into place when the epoch is committed, never over another file (see `FileSink`).
Its directory must be trusted and its staging directory is private
(`safefiles`): a name another local user planted is never written through.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from nopstream import safefiles
from nopstream.connectors.object_format import object_source, sink_format
from nopstream.connectors.staged import ObjectSink, OutputConflict, SinkName
from nopstream.connectors.striped import at_cursor as _at
from nopstream.errors import RestoreRefused, StartRefused
from nopstream.model.connectors import FileSinkConfig, FileSourceConfig
from nopstream.records import Batch, SourceReader

_HEAD = 4096  # bytes of a file's head hashed to tell a different file under the same name


class LocalFiles:
    """The files matching a glob, each told from another under its path by a hash of its head."""

    identity_field = "heads"

    def __init__(self, pattern: str) -> None:
        """The files `pattern` matches (recursive `**` allowed)."""
        self.pattern = pattern

    def names(self) -> list[str]:
        """Every file the pattern matches now, in path order."""
        return [p for p in sorted(glob.glob(self.pattern, recursive=True)) if Path(p).is_file()]

    def open(self, name: str, identity: Any) -> BinaryIO:
        """The file, opened for reading; RuntimeError when its head is not `identity`'s."""
        f = open(name, "rb")  # noqa: SIM115 (handed to the reader, which closes it)
        if identity is not None and _head_differs(f, identity):
            f.close()
            raise RuntimeError(
                f"file '{name}' changed under a running job: its first {identity[0]} bytes differ"
            )
        return f

    def size(self, name: str, handle: BinaryIO) -> int:
        """The open file's size now."""
        return os.fstat(handle.fileno()).st_size

    def identity(self, name: str) -> list[Any]:
        """[bytes hashed, sha256 of them] of the file's head."""
        with open(name, "rb") as f:
            n = min(os.fstat(f.fileno()).st_size, _HEAD)
            return [n, _head_hash(f, n)]

    def reading_to(self, name: str, end: int) -> None:
        """Nothing: a file is read through the page cache."""

    def check(self, split: str, name: str, cursor: int | None, identity: Any) -> None:
        """RestoreRefused naming the split when its file is not the one its cursor was taken in."""
        rule = "a file being read must not shrink or be replaced (docs/runtime.md)"
        try:
            size = os.stat(name).st_size
        except FileNotFoundError:
            raise RestoreRefused(f"split '{split}' is gone{_at(cursor)}: {rule}") from None
        if cursor is not None and size < cursor:
            raise RestoreRefused(
                f"split '{split}' changed under its cursor: the file has {size} bytes, the cursor is at"
                f" byte {cursor}: {rule}"
            )
        if identity is None:
            return
        with open(name, "rb") as f:
            differs = _head_differs(f, identity)
        if differs:
            raise RestoreRefused(
                f"split '{split}' changed under its cursor: its file's first {identity[0]} bytes differ:"
                f" {rule}"
            )


def file_source(
    config: FileSourceConfig | dict[str, Any],
    *,
    subtask: int,
    parallelism: int,
    keep_unreadable: bool = False,
) -> SourceReader:
    """The reader of one source subtask's share of the files (`object_format.object_source`)."""
    c = FileSourceConfig.model_validate(config)
    return object_source(
        LocalFiles(c.path),
        c,
        subtask=subtask,
        parallelism=parallelism,
        discovery_ms=c.discovery_interval_ms,
        keep_unreadable=keep_unreadable,
    )


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
        fmt = sink_format(c)
        super().__init__(name, fmt, fmt.ext)
        self.dir = Path(c.path)
        self.staging = self.dir / ".staging"
        try:
            safefiles.trusted_dir(self.dir, what="the file sink's directory")
            safefiles.private_dir(self.staging, what="the file sink's staging directory")
        except safefiles.UnsafePath as unsafe:
            raise StartRefused(str(unsafe)) from None
        self._file: Any = None
        self._file_epoch = 0  # the epoch the open transaction's staged file is named for

    def _staged(self, epoch: int) -> Path:
        return self.staging / self._object(epoch)

    def write(self, batch: Batch) -> None:
        """Append the batch to the open transaction's staged file (created fresh, over whatever a dead
        run left at its name, by its first batch); a record the format cannot write fails the run
        before any of the batch is."""
        data = self._add(batch.records, "file")
        if self._file is None:
            staged = self._staged(self.epoch)
            staged.unlink(missing_ok=True)
            self._file = os.fdopen(safefiles.create_new(staged, mode=0o644), "wb")
            self._file_epoch = self.epoch
        with self._naming_the_file():
            self._file.write(data)
        self.records += len(batch.records)

    def _release(self) -> None:
        """The open transaction's file ended, flushed, fsynced and closed."""
        if self._file is not None:
            with self._naming_the_file():
                self._file.write(self._end())
                self._file.flush()
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    @contextlib.contextmanager
    def _naming_the_file(self) -> Iterator[None]:
        """An OSError of the open staged file (a full disk) names the file."""
        try:
            yield
        except OSError as err:
            raise OSError(err.errno, err.strerror, str(self._staged(self._file_epoch))) from None

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
            if not _same_file(staged, final):
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
        """Nothing: the open transaction's file is ended when its epoch's barrier stages it."""


def committed_records(config: FileSinkConfig | dict[str, Any]) -> list[Any]:
    """Every record committed in a file sink's directory, decoded (`nopstream chaos`)."""
    c = FileSinkConfig.model_validate(config)
    directory = Path(c.path)
    paths = sorted(p for p in directory.iterdir() if p.is_file()) if directory.is_dir() else []
    fmt = sink_format(c)
    return [r for p in paths for r in fmt.records(p.read_bytes())]


def _head_hash(f: BinaryIO, n: int) -> str:
    """The sha256 of an open file's first `n` bytes (it is left positioned after them)."""
    f.seek(0)
    return hashlib.sha256(f.read(n)).hexdigest()


def _head_differs(f: BinaryIO, identity: Any) -> bool:
    """Whether an open file's head is not the one `identity` ([bytes hashed, their sha256]) names."""
    return _head_hash(f, int(identity[0])) != str(identity[1])


def _same_file(staged: Path, final: Path) -> bool:
    """Whether `final` is the staged file itself, not a link planted at its name."""
    a, b = os.lstat(staged), os.lstat(final)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
