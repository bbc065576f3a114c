"""Where a connector finds its secrets: the mounted Secret its `secretRef` names on a cluster, else
the files and environment variables of the machine that runs the task. Never the model or the plan."""

from __future__ import annotations

import os
from pathlib import Path

from nopstream.model.connectors import SECRETS_DIR, TlsFiles


def mounted(secret_ref: str | None, key: str) -> Path | None:
    """The file of `key` in the Secret `secret_ref` names, when it is mounted here (a pod)."""
    if secret_ref is None:
        return None
    path = Path(SECRETS_DIR) / secret_ref / key
    return path if path.is_file() else None


def password(secret_ref: str | None, env: str, key: str = "password") -> str:
    """The mounted Secret's `key`, else the environment variable `env` ("" without either)."""
    path = mounted(secret_ref, key)
    return path.read_text().rstrip("\n") if path is not None else os.environ.get(env, "")


def tls_paths(tls: TlsFiles, secret_ref: str | None) -> tuple[str | None, str | None, str | None]:
    """The CA, client certificate and key files of `tls`: each given file, else the mounted Secret's
    `ca.crt`, `tls.crt` or `tls.key`, else None."""

    def given(path: str | None, key: str) -> str | None:
        found = mounted(secret_ref, key) if path is None else None
        return str(found) if found is not None else path

    return given(tls.ca_file, "ca.crt"), given(tls.cert_file, "tls.crt"), given(tls.key_file, "tls.key")
