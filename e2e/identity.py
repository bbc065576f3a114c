"""An OAuth 2.0 identity provider for the tests: Ory Hydra (its Go module, built by
`scripts/install-servers.sh hydra`), signing its access tokens with a `certs.SigningKey`.

The key is made before the Kafka broker starts, which reads its public half from a
file (Kafka's JWKS validator loads a `file:` URL once, at start); Hydra, started only
by the tests that ask for it, is given the private half before it grants a token. So
the broker, a session fixture, never waits for Hydra, and Hydra costs nothing to a
test session that does not use it.
"""

from __future__ import annotations

import json
import secrets
import ssl
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.certs import KeyPair, SigningKey
from e2e.servers import OAUTH_ISSUER, Child, free_port, spawn, wait_until


@dataclass
class Hydra:
    """Ory Hydra on loopback over HTTPS (a certificate of the tests' CA): its public and admin ports."""

    process: Child
    public: int
    admin: int
    ca: Path

    @property
    def token_endpoint(self) -> str:
        """Where a client is granted its token (client credentials)."""
        return f"https://127.0.0.1:{self.public}/oauth2/token"

    def _admin(self, method: str, path: str, body: Any) -> Any:
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.admin}{path}",
            data=json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": "application/json"},
        )
        context = ssl.create_default_context(cafile=str(self.ca))
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return json.loads(response.read() or b"null")

    def sign_with(self, key: SigningKey) -> None:
        """Access tokens are signed with `key` from now on (the set Hydra signs them with, replaced)."""
        self._admin(
            "PUT", "/admin/keys/hydra.jwt.access-token", {"keys": [json.loads(key.private.read_text())]}
        )

    def client(self, client_id: str, secret: str, scope: str, *, method: str = "client_secret_basic") -> None:
        """A client that may be granted tokens of `scope` for its id and secret, sent as `method` says
        (HTTP basic, or `client_secret_post`: in the form)."""
        self._admin(
            "POST",
            "/admin/clients",
            {
                "client_id": client_id,
                "client_secret": secret,
                "grant_types": ["client_credentials"],
                "scope": scope,
                "token_endpoint_auth_method": method,
            },
        )

    def stop(self) -> None:
        """Stop it by PID."""
        self.process.stop()


def start_hydra(workdir: Path, *, binary: str, serving: KeyPair, ca: Path, key: SigningKey) -> Hydra:
    """Start Hydra (in memory, JWT access tokens of `OAUTH_ISSUER` signed by `key`) and wait for it."""
    workdir.mkdir(parents=True, exist_ok=True)
    public, admin = free_port(), free_port()
    config = {
        "dsn": "memory",
        "serve": {
            "public": {"host": "127.0.0.1", "port": public},
            "admin": {"host": "127.0.0.1", "port": admin},
            "tls": {"enabled": True, "cert": {"path": str(serving.cert)}, "key": {"path": str(serving.key)}},
        },
        "urls": {"self": {"issuer": OAUTH_ISSUER}},
        "secrets": {"system": [secrets.token_urlsafe(24)]},
        "strategies": {"access_token": "jwt"},
        "log": {"level": "warn"},
    }
    (workdir / "hydra.yaml").write_text(yaml.safe_dump(config))
    argv = [binary, "serve", "all", "-c", str(workdir / "hydra.yaml")]
    hydra = Hydra(spawn("hydra", argv, log=workdir / "hydra.log"), public, admin, ca)
    context = ssl.create_default_context(cafile=str(ca))

    def ready() -> bool:
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{admin}/health/ready", timeout=2, context=context
            ):
                return True
        except OSError:
            return False

    wait_until("hydra", ready, process=hydra.process, timeout=60)
    hydra.sign_with(key)
    return hydra
