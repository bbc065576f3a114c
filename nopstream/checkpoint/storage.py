"""Checkpoint storage behind one interface, and the local-directory backend.

Paths are relative to the storage root and use '/' (`checkpoint/{ns}/{epoch}/...`).
`put` is atomic: a reader sees the whole object or none. Locally that is a temp
file made durable, a rename, and the rename made durable; on S3 (`nopstream/s3.py`)
a single PUT. Writers put segments first and the manifest last: the manifest is the
commit point of an epoch.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from nopstream import safefiles
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
        """Store under `root` (created when missing); StorageError when it is not trusted (`safefiles`)."""
        self.root = Path(root)
        try:
            safefiles.trusted_dir(self.root, what="the checkpoint directory")
        except safefiles.UnsafePath as exc:
            raise StorageError(str(exc)) from None

    def _file(self, path: str) -> Path:
        if path.startswith("/") or ".." in path.split("/"):
            raise StorageError(f"bad object path {path!r}")
        return self.root / path

    def put(self, path: str, data: bytes) -> None:
        """Temp file, made durable, renamed into place, the rename made durable."""
        self.put_many({path: data})

    def put_many(self, objects: dict[str, bytes]) -> None:
        """Every object through a temp file and a rename; all of them durable when it returns.

        The temp files are durable before any is renamed, so a crash never leaves a
        name on half an object. StorageError naming the object when it cannot be
        written (a file where a directory should be, a directory where the object
        should be, no permission, a full disk).
        """
        staged: list[tuple[str, Path, Path]] = []  # (object path, file, temp file) until renamed
        try:
            for path, data in objects.items():
                target = self._file(path)
                with self._writing(path):
                    staged.append((path, target, _write_temp(target, data)))
            every = next(iter(objects), "") + (f" and {len(objects) - 1} more" if len(objects) > 1 else "")
            with self._writing(every):
                make_durable(tmp for _, _, tmp in staged)
            directories = {target.parent for _, target, _ in staged}
            while staged:
                path, target, tmp = staged[-1]
                with self._writing(path):
                    os.replace(tmp, target)
                staged.pop()
            with self._writing(every):
                make_durable(directories)
        finally:
            for _, _, tmp in staged:
                tmp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """An OSError inside becomes a StorageError naming `what`."""
        try:
            yield
        except OSError as exc:
            raise StorageError(f"cannot write {self.describe()}/{what}: {exc.strerror or exc}") from None

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


def _write_temp(target: Path, data: bytes) -> Path:
    """A temp file beside `target` holding `data`, not yet durable; its path."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


_SYNCFS = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)  # Linux; Python has no binding


def make_durable(paths: Iterable[Path]) -> None:
    """Files' data, or directories' entries, on disk: one `syncfs` per file system among
    them (Linux), else an fsync of each.

    An epoch of a task is dozens of small segments, each in a shard directory of its
    own: an fsync per file and per directory took 130-190 ms for 64 segments here,
    at the end of every bounded job too; two syncfs calls take 12-24 ms. The price:
    syncfs also flushes whatever else is dirty on that file system (PostgreSQL's
    `recovery_init_sync_method = syncfs` makes the same trade).
    """
    paths = list(paths)
    if _SYNCFS is None:
        for path in paths:
            _on_open(path, os.fsync)
        return
    for path in {os.stat(path).st_dev: path for path in paths}.values():  # one per file system
        _on_open(path, _syncfs)


def _syncfs(fd: int) -> None:
    assert _SYNCFS is not None
    if _SYNCFS(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _on_open(path: Path, call: Callable[[int], None]) -> None:
    """`call` on a read-only descriptor of `path`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        call(fd)
    finally:
        os.close(fd)
