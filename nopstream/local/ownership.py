"""One running job per checkpoint namespace: the lock `nopstream run` holds while it runs.

A lock file per (storage, namespace), held with `flock` for the whole command, so a
second `nopstream run` of the same namespace is refused at once, naming the holder,
before it touches anything. The kernel releases the lock when the holder dies, even
by SIGKILL, so a crashed run never leaves a stale lock behind. For local checkpoint
storage the lock file lives in the storage directory (`locks/`, beside
`checkpoint/`), so every run using that directory is excluded, whatever its working
directory; for S3 storage it lives in this machine's temporary directory, so runs on
one machine are excluded (with `--etcd` the job's lease excludes the others).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from nopstream.checkpoint.storage import LocalStorage, Storage


class NamespaceHeld(RuntimeError):
    """Another run holds the checkpoint namespace; the message names it."""


def lock_path(storage: Storage, namespace: str) -> Path:
    """The lock file of a checkpoint namespace in a storage."""
    digest = hashlib.sha256(f"{storage.describe()}\0{namespace}".encode()).hexdigest()[:24]
    if isinstance(storage, LocalStorage):
        return storage.root / "locks" / f"{digest}.lock"
    return Path(tempfile.gettempdir()) / "nopstream-locks" / f"{digest}.lock"


@contextlib.contextmanager
def hold(storage: Storage, namespace: str, *, holder: str) -> Iterator[None]:
    """Hold the namespace while the block runs; NamespaceHeld when another process holds it."""
    path = lock_path(storage, namespace)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            raise NamespaceHeld(
                f"checkpoint namespace '{namespace}' in {storage.describe()} is held by {other}"
                " (one running job per checkpoint namespace)"
            ) from None
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder} (pid {os.getpid()}, since {started})\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
