"""Checkpoint storage behind one interface, and the local-directory backend.

Paths are relative to the storage root and use '/' (`checkpoint/{ns}/{epoch}/...`).
`put` is atomic: a reader sees the whole object or none. Locally that is a temp
file, fsync, rename, and an fsync of the directory; on S3 (`nopstream/s3.py`) a
single PUT. Writers put segments first and the manifest last: the manifest is the
commit point of an epoch.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Protocol

from nopstream.errors import StorageError


class Storage(Protocol):
    """Objects by path: atomic put, get, list by prefix, delete."""

    def put(self, path: str, data: bytes) -> None:
        """Write an object atomically."""
        ...

    def put_many(self, objects: dict[str, bytes]) -> None:
        """Write several objects, each atomically (a task's segments of one epoch)."""
        ...

    def get(self, path: str) -> bytes:
        """An object's bytes; StorageError (naming the path) when it is missing."""
        ...

    def exists(self, path: str) -> bool:
        """Whether an object exists."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Every object path under a prefix, sorted."""
        ...

    def delete(self, path: str) -> None:
        """Remove an object (a missing one is fine)."""
        ...

    def describe(self) -> str:
        """Where the storage is, for messages."""
        ...


class LocalStorage:
    """A directory on this machine."""

    def __init__(self, root: str | Path) -> None:
        """Store under `root` (created when missing)."""
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot use {self.root} for checkpoints: {exc.strerror or exc}") from None

    def _file(self, path: str) -> Path:
        if path.startswith("/") or ".." in path.split("/"):
            raise StorageError(f"bad object path {path!r}")
        return self.root / path

    def put(self, path: str, data: bytes) -> None:
        """Temp file, fsync, rename into place, fsync the directory."""
        self.put_many({path: data})

    def put_many(self, objects: dict[str, bytes]) -> None:
        """Each object through a temp file, fsync and rename; then each directory fsynced once.

        StorageError naming the object when it cannot be written (a file where a
        directory should be, a directory where the object should be, no permission, a
        full disk).
        """
        directories = set()
        for path, data in objects.items():
            target = self._file(path)
            try:
                _write_atomically(target, data)
            except OSError as exc:
                raise StorageError(f"cannot write {self.describe()}/{path}: {exc.strerror or exc}") from None
            directories.add(target.parent)
        for directory in directories:
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def get(self, path: str) -> bytes:
        """An object's bytes."""
        try:
            return self._file(path).read_bytes()
        except FileNotFoundError:
            raise StorageError(f"{self.describe()}/{path} is missing") from None
        except OSError as exc:  # a directory where the object should be, no permission, ...
            raise StorageError(f"cannot read {self.describe()}/{path}: {exc.strerror or exc}") from None

    def exists(self, path: str) -> bool:
        """Whether an object exists (something else at its path is not the object)."""
        return self._file(path).is_file()

    def list(self, prefix: str) -> list[str]:
        """Every object under a prefix (temp files of unfinished puts are not objects).

        Only the prefix's deepest directory is walked: a root shared by many jobs
        costs one job's listing what that job holds, not what all of them hold.
        """
        head = prefix.rpartition("/")[0]
        out = []
        for directory, _, names in os.walk(self._file(head) if head else self.root):
            rel_dir = Path(directory).relative_to(self.root).as_posix()
            for name in names:
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if rel.startswith(prefix) and not name.startswith(".tmp-"):
                    out.append(rel)
        return sorted(out)

    def delete(self, path: str) -> None:
        """Remove an object and any directories it leaves empty."""
        target = self._file(path)
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        parent = target.parent
        while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    def describe(self) -> str:
        """The directory, absolute."""
        return str(self.root.resolve())


def _write_atomically(target: Path, data: bytes) -> None:
    """A temp file beside `target`, written and fsynced, renamed over it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
