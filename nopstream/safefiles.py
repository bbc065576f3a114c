"""Paths no other local user can redirect: trusted and private directories, fresh files, lock files.

A directory is **trusted** when it and every directory above it (links resolved) is
owned by this user or by root and is writable by no one else, or is sticky (`/tmp`):
nobody else can then rename it, replace it, or plant a name in it that we would
write through (the rule OpenSSH's StrictModes applies to `~/.ssh`). A **private**
directory is one of ours that only we can enter (0700): run files, secrets, and the
lock files of storage that has no directory of its own live in one. Files are
created fresh (`O_CREAT|O_EXCL|O_NOFOLLOW`), so even a link planted before a check is
never written through; lock files are opened without following links and refused
unless they are ours.
WARNING: a directory is checked once, when it is first used; the check holds because a
trusted directory cannot change hands afterwards without root.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_LOCK = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path another local user could redirect, or that cannot be made safe; the message names it."""


def untrusted(directory: Path) -> str | None:
    """Why an existing directory is not trusted (see the module's rule), or None."""
    me = os.geteuid()
    real = Path(os.path.realpath(directory))
    for d in (real, *real.parents):
        st = os.stat(d)
        if st.st_uid not in (me, 0):
            return f"'{d}' is owned by another user (uid {st.st_uid})"
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            return f"'{d}' is writable by every user and not sticky"
    return None


def trusted_dir(path: Path, *, what: str, mode: int = 0o777) -> Path:
    """`path`, created when missing (`mode` less the umask); UnsafePath when it is not trusted."""
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
    except OSError as exc:
        raise UnsafePath(f"{what} '{path}' cannot be created: {exc.strerror or exc}") from None
    why = untrusted(path)
    if why is not None:
        raise UnsafePath(
            f"{what} '{path}' is not safe to write: {why} (rule: a directory nopstream writes into is"
            " owned by you or root and writable by nobody else, docs/security.md)"
        )
    return path


def private_dir(path: Path, *, what: str) -> Path:
    """`path` as a trusted directory of ours that only we can enter (made 0700, or narrowed to it).

    UnsafePath when it is a link, another user's, or writable by anyone else (a name
    may have been planted in it already): a directory merely readable by others is
    narrowed, since nothing can have been put into it.
    """
    trusted_dir(path.parent, what=f"the directory holding {what}")
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise UnsafePath(f"{what} '{path}' cannot be created: {exc.strerror or exc}") from None
    rule = "(rule: a private directory of nopstream is yours, mode 0700, docs/security.md)"
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{what} '{path}' is not a directory (a link or a file) {rule}")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{what} '{path}' is owned by another user (uid {st.st_uid}) {rule}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePath(f"{what} '{path}' is writable by other users {rule}")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def user_dir() -> Path:
    """This user's private directory: `$XDG_RUNTIME_DIR/nopstream`, else `{tmp}/nopstream-{uid}`."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = (
        Path(runtime) / "nopstream" if runtime else Path(tempfile.gettempdir()) / f"nopstream-{os.geteuid()}"
    )
    return private_dir(base, what="nopstream's private directory")


def create_new(path: Path, *, mode: int = 0o600) -> int:
    """A new file `path` open for writing; FileExistsError when any name (a link too) is there."""
    return os.open(path, _CREATE_NEW, mode)


def replace_file(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write `path` as a new file holding `data` (a name already there is removed, not written through)."""
    path.unlink(missing_ok=True)
    fd = create_new(path, mode=mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def open_lock(path: Path) -> int:
    """A read-write descriptor of lock file `path` (made 0600); UnsafePath when it is a link or not ours."""
    try:
        fd = os.open(path, _OPEN_LOCK, 0o600)
    except OSError as exc:
        raise UnsafePath(
            f"lock file '{path}' cannot be opened: {exc.strerror or exc} (a link is never followed)"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise UnsafePath(f"lock file '{path}' is not a file of yours (rule: docs/security.md)")
    return fd
