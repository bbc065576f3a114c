"""How a client reaches an etcd that speaks TLS or checks who calls: the files of one directory.

An `EtcdAccess` is read from one directory (`read_access`), its files named like a
Kubernetes TLS Secret's keys: `ca.crt` (the CA the server certificate is checked
against), `tls.crt` and `tls.key` (a client certificate: with etcd's
`--client-cert-auth`, its common name is the etcd user), `username` and `password`
(etcd's password authentication). Every etcd client of a process finds that directory
in ACCESS_ENV (`access_from_env`): the processes of `nopstream run --etcd` inherit it
from the command, pods from the operator. Apart from the client (`cluster.etcd`), so
that a process that only reads its settings does not load gRPC.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_FILES = ("ca.crt", "tls.crt", "tls.key", "username", "password")


ACCESS_ENV = "NOPSTREAM_ETCD_ACCESS"
"""The variable naming an etcd access directory; unset: plain text, nobody named."""
START_WAIT_S = 30.0
"""How long `nopstream run --etcd` waits for etcd to answer at its start, unless `--etcd-wait` says."""


class AccessError(ValueError):
    """An etcd access directory is unusable; the message names the file and the rule."""


@dataclass(frozen=True)
class EtcdAccess:
    """How a client checks etcd and proves itself to it: PEM bytes for TLS, a user and password."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def read_access(directory: Path) -> EtcdAccess:
    """The EtcdAccess in `directory` (see the module); AccessError naming the file and the rule."""
    if not directory.is_dir():
        raise AccessError(f"{directory}: not a directory (it holds {', '.join(ACCESS_FILES)})")

    def read(name: str) -> bytes | None:
        path = directory / name
        try:
            return path.read_bytes() if path.exists() else None
        except OSError as err:
            raise AccessError(f"{path}: cannot be read ({err.strerror or err})") from None

    ca, cert, key, user, password = (read(name) for name in ACCESS_FILES)
    if (cert is None) != (key is None):
        raise AccessError(f"{directory}: tls.crt and tls.key go together (one of them is missing)")
    if (user is None) != (password is None):
        raise AccessError(f"{directory}: username and password go together (one of them is missing)")
    for name, pem in zip(ACCESS_FILES, (ca, cert, key), strict=False):
        if pem is not None and b"-----BEGIN " not in pem:
            raise AccessError(f"{directory / name}: not a PEM file")
    if ca is None and cert is None and user is None:
        raise AccessError(f"{directory}: holds none of ca.crt, tls.crt, username")
    return EtcdAccess(
        ca=ca,
        cert=cert,
        key=key,
        username=None if user is None else user.decode().strip(),
        password=None if password is None else password.decode().strip(),
    )


def access_from_env(env: Mapping[str, str] = os.environ) -> EtcdAccess | None:
    """The EtcdAccess of the directory ACCESS_ENV names, or None; AccessError naming the variable."""
    directory = env.get(ACCESS_ENV, "").strip()
    if not directory:
        return None
    try:
        return read_access(Path(directory))
    except AccessError as err:
        raise AccessError(f"{ACCESS_ENV}: {err}") from None
