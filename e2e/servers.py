"""Real servers for tests, started on free loopback ports in temporary directories.

Every server is a child process in its own session, stopped by PID (SIGTERM, then
SIGKILL after a grace period) when its context ends, and on interpreter exit as a
last resort, so no test leaves a process behind. Binaries come from
`scripts/install-servers.sh`: Debian's etcd and PostgreSQL, and MinIO built into the
cache.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nopstream.local import children
from nopstream.local.children import Child

if TYPE_CHECKING:
    from e2e.certs import KeyPair, Pki, SigningKey

CACHE = Path(os.environ.get("NOPSTREAM_CACHE", Path.home() / ".cache" / "nopstream"))
BIN = CACHE / "bin"

_RUNNING: dict[int, Child] = {}
"""Every server started, stopped on interpreter exit as a last resort."""


class ServerError(RuntimeError):
    """A server could not be found, started, or made ready."""


def binary(name: str) -> str:
    """The path of a server binary: the cache first, then PATH; ServerError when absent."""
    cached = BIN / name
    if cached.exists():
        return str(cached)
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        raise ServerError(f"{name} is not installed: run scripts/install-servers.sh")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def spawn(
    name: str,
    argv: list[str],
    *,
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> Child:
    """Start `argv` in its own session (as `user`, when given) with stdout and stderr going to `log`."""
    environment = {**os.environ, **(env or {})}
    child = children.spawn(name, argv, log=log, env=environment, cwd=cwd, session=True, user=user)
    _RUNNING[child.pid] = child
    return child


@atexit.register
def _stop_all() -> None:
    children.stop_all(_RUNNING.values(), grace=5)


def wait_until(
    what: str, ready: Callable[[], bool], *, process: Child | None = None, timeout: float = 60.0
) -> None:
    """Poll `ready` until it is true; ServerError with the log tail on timeout or exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and not process.alive():
            raise ServerError(f"{what}: exited with {process.returncode}\n{process.tail(30)}")
        with contextlib.suppress(OSError, urllib.error.URLError, ConnectionError):
            if ready():
                return
        time.sleep(0.1)
    tail = process.tail(30) if process else ""
    raise ServerError(f"{what}: not ready after {timeout:.0f}s\n{tail}")


def http_ok(url: str, expect: bytes | None = None, *, context: ssl.SSLContext | None = None) -> bool:
    """Whether GET `url` answers 200 (and contains `expect` when given; over TLS with `context`)."""
    with urllib.request.urlopen(url, timeout=2, context=context) as resp:
        body: bytes = resp.read()
        return resp.status == 200 and (expect is None or expect in body)


@dataclass
class Etcd:
    """A single-member etcd server on loopback."""

    process: Child
    client_url: str
    data_dir: Path

    @property
    def endpoint(self) -> tuple[str, int]:
        """(host, port) of the client URL."""
        host, port = self.client_url.split("://")[-1].split(":")
        return host, int(port)

    def stop(self) -> None:
        """Stop the server by PID."""
        self.process.stop()


def etcd_argv(name: str, data: Path, *, host: str, client: int, peer: int, metrics: int) -> list[str]:
    """The command line of a single-member etcd on `host`."""
    url = f"http://{host}:{client}"
    return [
        binary("etcd"),
        "--name",
        name,
        "--data-dir",
        str(data),
        "--listen-client-urls",
        url,
        "--advertise-client-urls",
        url,
        "--listen-peer-urls",
        f"http://{host}:{peer}",
        "--initial-advertise-peer-urls",
        f"http://{host}:{peer}",
        "--initial-cluster",
        f"{name}=http://{host}:{peer}",
        "--listen-metrics-urls",
        f"http://{host}:{metrics}",
    ]


ETCD_ENV = {"ETCD_LOG_LEVEL": "warn"}


SECURE_ETCD_USER = "nopstream"
"""The user of `start_secure_etcd` that may read and write every key: a client certificate's common
name, or by password."""


def _etcd_call(url: str, context: ssl.SSLContext, path: str, body: dict[str, object] | None = None) -> object:
    """POST to the JSON gateway of the etcd at `url` (`/v3/{path}`) over TLS with `context`; its answer."""
    request = urllib.request.Request(f"{url}/v3/{path}", data=json.dumps(body or {}).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5, context=context) as resp:
        return json.loads(resp.read())


def enable_etcd_auth(url: str, pki: Pki, password: str, *, process: Child | None = None) -> None:
    """Once the etcd at `url` (TLS only, client certificates of `pki`'s CA) answers, turn
    authentication on, called as `root` (a certificate `pki` issues): `root`, and SECURE_ETCD_USER
    (its certificate's common name, or `password`) allowed to read and write every key."""
    root = pki.issue("etcd-root", "root")
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    context.load_cert_chain(str(root.cert), str(root.key))
    wait_until(
        f"etcd at {url}", lambda: bool(_etcd_call(url, context, "maintenance/status")), process=process
    )
    every_key = base64.b64encode(b"\0").decode()
    _etcd_call(url, context, "auth/user/add", {"name": "root", "password": secrets.token_hex(8)})
    _etcd_call(url, context, "auth/user/grant", {"user": "root", "role": "root"})
    _etcd_call(url, context, "auth/user/add", {"name": SECURE_ETCD_USER, "password": password})
    _etcd_call(url, context, "auth/role/add", {"name": "jobs"})
    perm = {"permType": "READWRITE", "key": every_key, "range_end": every_key}
    _etcd_call(url, context, "auth/role/grant", {"name": "jobs", "perm": perm})
    _etcd_call(url, context, "auth/user/grant", {"user": SECURE_ETCD_USER, "role": "jobs"})
    _etcd_call(url, context, "auth/enable")


def start_secure_etcd(workdir: Path, pki: Pki, password: str) -> Etcd:
    """etcd serving TLS only with a certificate of `pki`, admitting clients with a certificate of its CA,
    and checking who calls: SECURE_ETCD_USER (a certificate's common name, or `password`) may read and
    write every key; a certificate of another name may do nothing."""
    client, server = free_port(), pki.issue("etcd-server", "etcd", server_ips=("127.0.0.1",))
    url = f"https://127.0.0.1:{client}"
    plain = etcd_argv(
        "etcd", workdir / "etcd-data", host="127.0.0.1", client=client, peer=free_port(), metrics=free_port()
    )
    argv = [url if a == f"http://127.0.0.1:{client}" else a for a in plain]  # its client URLs: https
    argv += ["--cert-file", str(server.cert), "--key-file", str(server.key)]
    argv += ["--client-cert-auth", "--trusted-ca-file", str(pki.ca.cert)]
    proc = spawn("etcd-secure", argv, log=workdir / "etcd.log", env=ETCD_ENV)
    enable_etcd_auth(url, pki, password, process=proc)
    return Etcd(proc, url, workdir / "etcd-data")


def start_etcd(
    workdir: Path, *, name: str = "etcd", data_dir: Path | None = None, client_port: int | None = None
) -> Etcd:
    """Start etcd in `workdir` (or on an existing data dir and port, to restart it)."""
    client = client_port or free_port()
    data = data_dir or workdir / f"{name}-data"
    url = f"http://127.0.0.1:{client}"
    argv = etcd_argv(name, data, host="127.0.0.1", client=client, peer=free_port(), metrics=free_port())
    proc = spawn(name, argv, log=workdir / f"{name}.log", env=ETCD_ENV)
    wait_until(name, lambda: http_ok(f"{url}/health", b'"health":"true"'), process=proc)
    return Etcd(proc, url, data)


@dataclass
class Minio:
    """A single-drive MinIO server on loopback with generated credentials."""

    process: Child
    endpoint: str
    access_key: str
    secret_key: str
    data_dir: Path = field(repr=False)
    scheme: str = "http"

    @property
    def url(self) -> str:
        """The server's URL (https when it serves TLS)."""
        return f"{self.scheme}://{self.endpoint}"

    def stop(self) -> None:
        """Stop the server by PID."""
        self.process.stop()


def start_minio(workdir: Path, *, pki: Pki | None = None) -> Minio:
    """Start MinIO with a temporary data directory and fresh credentials (serving TLS only, with a
    certificate of `pki`, when given)."""
    port, console = free_port(), free_port()
    access, secret = f"nop{secrets.token_hex(4)}", secrets.token_hex(16)
    data = workdir / "minio-data"
    data.mkdir(parents=True, exist_ok=True)
    # not --quiet: what it waits on shows in its log (a fresh server's first bucket took 60 s in two
    # CI runs; not reproduced on demand, loaded or not)
    argv = [
        binary("minio"),
        "server",
        str(data),
        "--address",
        f"127.0.0.1:{port}",
        "--console-address",
        f"127.0.0.1:{console}",
    ]
    scheme, context = "http", None
    if pki is not None:  # MinIO serves TLS when its certificates directory holds a key pair
        pair = pki.issue("minio", "minio", server_ips=("127.0.0.1",))
        certs = workdir / "minio-certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(pair.cert, certs / "public.crt")
        shutil.copy(pair.key, certs / "private.key")
        argv += ["--certs-dir", str(certs)]
        scheme, context = "https", ssl.create_default_context(cafile=str(pki.ca.cert))
    env = {
        "MINIO_ROOT_USER": access,
        "MINIO_ROOT_PASSWORD": secret,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
        "HOME": str(workdir),
    }
    proc = spawn("minio", argv, log=workdir / "minio.log", env=env)
    ready = f"{scheme}://127.0.0.1:{port}/minio/health/ready"
    wait_until("minio", lambda: http_ok(ready, context=context), process=proc)
    return Minio(proc, f"127.0.0.1:{port}", access, secret, data, scheme)


PG_BIN = Path("/usr/lib/postgresql/15/bin")


@dataclass
class Postgres:
    """A PostgreSQL 15 server on loopback with prepared transactions enabled and a password."""

    process: Child
    port: int
    user: str
    password: str
    data_dir: Path = field(repr=False)
    workdir: Path = field(repr=False)
    tls: PostgresTls | None = None
    """A client's TLS files (server verified, client certificate for the server's own user)."""

    @property
    def env(self) -> dict[str, str]:
        """What a postgres sink reads its password from."""
        return {"NOPSTREAM_POSTGRES_PASSWORD": self.password}

    @property
    def conninfo(self) -> str:
        """A libpq connection string for the `postgres` database (over verified TLS when it has TLS)."""
        info = f"host=127.0.0.1 port={self.port} dbname=postgres user={self.user} password={self.password}"
        if self.tls is not None:
            t = self.tls
            info += f" sslmode=verify-full sslrootcert={t.ca} sslcert={t.cert} sslkey={t.key}"
        return info

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server by PID: a fast shutdown (SIGINT: sessions ended, prepared transactions
        kept), SIGKILL after `grace` seconds."""
        self.process.signal(signal.SIGINT)
        self.process.wait(grace)
        self.process.stop(grace)

    def restart(self, *, down: float = 0.0) -> None:
        """Stop the server and, `down` seconds later, start it again on the same port and data."""
        self.stop()
        time.sleep(down)
        self.process = _postgres_process(self.workdir, self.data_dir, self.port, tls=self.tls is not None)
        _wait_postgres(self)

    def close(self) -> None:
        """Stop the server and remove its data directory."""
        self.stop()
        shutil.rmtree(self.data_dir.parent, ignore_errors=True)


def _postgres_user() -> str | None:
    """PostgreSQL refuses to run as root: the Debian package's `postgres` user then."""
    return "postgres" if os.geteuid() == 0 else None


@dataclass(frozen=True)
class PostgresTls:
    """The files a client of a TLS test server uses."""

    ca: Path
    cert: Path
    key: Path


def _postgres_process(
    workdir: Path, data: Path, port: int, *, prepared: int = 64, tls: bool = False
) -> Child:
    argv = [
        str(PG_BIN / "postgres"),
        "-D",
        str(data),
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        f"port={port}",
        "-c",
        f"unix_socket_directories={data}",
        "-c",
        f"max_prepared_transactions={prepared}",
        "-c",
        "fsync=on",
        # logical decoding for the postgres-cdc source: slots of its tests and nopstream chaos's runs
        *("-c", "wal_level=logical", "-c", "max_replication_slots=32", "-c", "max_wal_senders=32"),
    ]
    if tls:  # the files `_serve_tls` put in the data directory
        argv += ["-c", "ssl=on", "-c", "ssl_cert_file=server.crt", "-c", "ssl_key_file=server.key"]
        argv += ["-c", "ssl_ca_file=ca.crt"]
    return spawn("postgres", argv, log=workdir / "postgres.log", user=_postgres_user())


def _wait_postgres(pg: Postgres) -> None:
    import psycopg

    def ready() -> bool:
        try:
            with psycopg.connect(pg.conninfo, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    wait_until("postgres", ready, process=pg.process)


def _serve_tls(data: Path, user: str | None, pki: Pki) -> PostgresTls:
    """Make the cluster in `data` take TLS only, with a SCRAM password and a client certificate of its
    CA for the user it names (pg_hba `clientcert=verify-full`); the client's files."""
    server = pki.issue("postgres-server", "127.0.0.1", server_names=("localhost",), server_ips=("127.0.0.1",))
    client = pki.issue("postgres-client", "nopstream")
    for source, name in ((server.cert, "server.crt"), (server.key, "server.key"), (pki.ca.cert, "ca.crt")):
        shutil.copy(source, data / name)
        (data / name).chmod(0o600)
        if user is not None:
            shutil.chown(data / name, user, user)
    (data / "pg_hba.conf").write_text(
        "local all all scram-sha-256\n"
        "hostnossl all all 0.0.0.0/0 reject\n"
        "hostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n"
        "hostssl replication all 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n"
    )
    return PostgresTls(pki.ca.cert, client.cert, client.key)


def start_postgres(workdir: Path, *, prepared: int = 64, tls: Pki | None = None) -> Postgres:
    """initdb a fresh cluster (superuser `nopstream`, a random password) and start it; with `tls` (an
    `e2e.certs.Pki`), it takes only TLS connections with a client certificate of that CA.

    The data directory lives in a directory of its own under the system temporary
    directory, owned by the server's user: pytest's directories are private to root.
    """
    import tempfile

    if not (PG_BIN / "initdb").exists():
        raise ServerError("PostgreSQL 15 is not installed: run scripts/install-servers.sh")
    user = _postgres_user()
    home = Path(tempfile.mkdtemp(prefix="nopstream-pg-"))
    data = home / "data"
    password = secrets.token_hex(12)
    (home / "pw").write_text(password + "\n")
    if user is not None:
        shutil.chown(home, user, user)
        shutil.chown(home / "pw", user, user)
    subprocess.run(
        [
            str(PG_BIN / "initdb"),
            *("-D", str(data), "-U", "nopstream", "--auth=scram-sha-256"),
            *("--pwfile", str(home / "pw"), "--no-sync"),
        ],
        check=True,
        capture_output=True,
        user=user,
        group=user,
    )
    (home / "pw").unlink()
    client = _serve_tls(data, user, tls) if tls is not None else None
    port = free_port()
    process = _postgres_process(workdir, data, port, prepared=prepared, tls=client is not None)
    pg = Postgres(process, port, "nopstream", password, data, workdir, client)
    _wait_postgres(pg)
    return pg


KAFKA_VERSION = "4.4.0"


@dataclass
class Kafka:
    """A single-node Kafka broker (KRaft: broker and controller in one JVM)."""

    process: Child
    listeners: KafkaListeners
    config: Path = field(repr=False)
    workdir: Path = field(repr=False)
    wrap: Callable[[list[str]], list[str]] = field(default=lambda argv: argv, repr=False)

    @property
    def bootstrap(self) -> str:
        """The `bootstrap.servers` of the broker, for clients on this machine."""
        return "{}:{}".format(*self.listeners.advertised)

    @property
    def auth(self) -> KafkaAuth:
        """The listeners that authenticate (a broker started with `auth`)."""
        if self.listeners.auth is None:
            raise ServerError("this broker was started without listeners that authenticate")
        return self.listeners.auth

    def stop(self, grace: float = 20.0) -> None:
        """Stop the broker by PID (SIGTERM: a controlled shutdown)."""
        self.process.stop(grace)

    def restart(self) -> None:
        """Stop the broker and start it again on the same ports and logs."""
        self.stop()
        self.process = _kafka_process(self.workdir, self.config, self.wrap, self.listeners.auth)
        _wait_kafka(self)


@dataclass(frozen=True)
class KafkaListeners:
    """Where a broker listens and what it advertises (host, port).

    `client` is bound for this machine's clients, who are told `advertised`; `pods`, when
    given, is a second listener that advertises itself (for clients elsewhere, such as
    pods in the test cluster's namespace).
    """

    client: tuple[str, int]
    advertised: tuple[str, int]
    controller: tuple[str, int]
    pods: tuple[str, int] | None = None
    auth: KafkaAuth | None = None

    @classmethod
    def loopback(cls, auth: KafkaAuth | None = None) -> KafkaListeners:
        """Free loopback ports of this machine (and the listeners of `auth`)."""
        port = free_port()
        return cls(("127.0.0.1", port), ("127.0.0.1", port), ("127.0.0.1", free_port()), auth=auth)

    def properties(self) -> list[str]:
        """The server.properties lines of these listeners."""
        listeners = ["PLAINTEXT://{}:{}".format(*self.client), "CONTROLLER://{}:{}".format(*self.controller)]
        advertised = ["PLAINTEXT://{}:{}".format(*self.advertised)]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        if self.pods is not None:
            listeners.append("PODS://{}:{}".format(*self.pods))
            advertised.append("PODS://{}:{}".format(*self.pods))
            protocols.append("PODS:PLAINTEXT")
        if self.auth is not None:
            for name, (host, port) in (("SASL_SSL", self.auth.sasl_ssl), ("SSL", self.auth.ssl)):
                listeners.append(f"{name}://{host}:{port}")
                advertised.append(f"{name}://{host}:{port}")
                protocols.append(f"{name}:{name}")
        return [
            *(self.auth.properties() if self.auth is not None else []),
            f"controller.quorum.voters=1@{self.controller[0]}:{self.controller[1]}",
            f"listeners={','.join(listeners)}",
            f"advertised.listeners={','.join(advertised)}",
            f"listener.security.protocol.map={','.join(protocols)}",
            # the broker talks to itself on the pods' listener when there is one: its
            # advertised client address may be a forward that only this machine reaches
            f"inter.broker.listener.name={'PODS' if self.pods is not None else 'PLAINTEXT'}",
        ]


OAUTH_ISSUER = "https://issuer.nopstream.test/"
"""The `iss` of the test identity provider's tokens (`e2e.identity`), which the broker expects: a
name, not where the provider listens."""


@dataclass(frozen=True)
class KafkaAuth:
    """Two loopback listeners of a broker that authenticate every client, and the files they need:
    SASL_SSL (PLAIN and SCRAM-SHA-256/512 for each of `users`, and OAUTHBEARER for a JWT of
    `OAUTH_ISSUER` signed by `signing`), and SSL requiring a client certificate of the CA.
    The broker's certificate names 127.0.0.1 and localhost."""

    sasl_ssl: tuple[str, int]
    ssl: tuple[str, int]
    users: tuple[tuple[str, str], ...]  # (name, password)
    ca: Path
    keystore: Path  # the broker's key and certificate in one PEM file
    client: KeyPair  # a client certificate of the CA, for `nopstream`
    signing: SigningKey  # the key of the identity provider whose tokens OAUTHBEARER takes
    pki: Pki = field(repr=False, compare=False)  # the CA, for more certificates

    @classmethod
    def issue(cls, pki: Pki, users: dict[str, str]) -> KafkaAuth:
        """Certificates of `pki` for the broker and a client, on free loopback ports."""
        server = pki.issue(
            "kafka-server", "127.0.0.1", server_names=("localhost",), server_ips=("127.0.0.1",)
        )
        keystore = pki.dir / "kafka-server.pem"
        keystore.write_bytes(server.key.read_bytes() + server.cert.read_bytes())
        client = pki.issue("kafka-client", "nopstream")
        ports = ("127.0.0.1", free_port()), ("127.0.0.1", free_port())
        from e2e.certs import SigningKey

        signing = SigningKey.make(pki.dir / "oauth")
        return cls(*ports, tuple(users.items()), pki.ca.cert, keystore, client, signing, pki)

    @property
    def sasl_bootstrap(self) -> str:
        """`bootstrap.servers` of the SASL_SSL listener."""
        return "{}:{}".format(*self.sasl_ssl)

    @property
    def ssl_bootstrap(self) -> str:
        """`bootstrap.servers` of the SSL listener."""
        return "{}:{}".format(*self.ssl)

    def properties(self) -> list[str]:
        """The server.properties lines of both listeners (besides their addresses)."""
        plain = " ".join(f'user_{name}="{password}"' for name, password in self.users)
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return [
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={self.keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.ca}",
            "listener.name.sasl_ssl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
            "listener.name.sasl_ssl.plain.sasl.jaas.config="
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};",
            f"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={scram}",
            f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram}",
            "listener.name.ssl.ssl.client.auth=required",
            "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config="
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            "listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class="
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
            f"sasl.oauthbearer.jwks.endpoint.url={self.signing.jwks.as_uri()}",
            f"sasl.oauthbearer.expected.issuer={OAUTH_ISSUER}",
            # librdkafka asks for a token without an audience, and Hydra then grants none
            "sasl.oauthbearer.allow.unverified.audience=true",
        ]

    def jvm_options(self) -> list[str]:
        """The broker JVM's system properties: Kafka reads a JWKS only from URLs it is told to allow."""
        return [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={self.signing.jwks.as_uri()}"]

    def format_arguments(self) -> list[str]:
        """StorageTool's arguments that store the SCRAM credentials of `users` (in KRaft's log)."""
        return [
            argument
            for name, password in self.users
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
            for argument in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
        ]


def _kafka_classpath() -> str:
    libs = CACHE / f"kafka-{KAFKA_VERSION}" / "libs"
    if not libs.is_dir():
        raise ServerError(f"Kafka {KAFKA_VERSION} is not installed: run scripts/install-servers.sh")
    return f"{libs}/*"


def _java(workdir: Path) -> list[str]:
    log4j = workdir / "log4j2.properties"
    log4j.write_text(
        "rootLogger.level = WARN\nrootLogger.appenderRef.out.ref = out\n"
        "appender.out.type = Console\nappender.out.name = out\nappender.out.layout.type = PatternLayout\n"
        "appender.out.layout.pattern = %d %p %c{1} %m%n\n"
    )
    # a small heap and the client JIT: ready in seconds, ~400 MB resident
    return [
        "java",
        "-Xmx512m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        _kafka_classpath(),
    ]


def _kafka_process(
    workdir: Path, config: Path, wrap: Callable[[list[str]], list[str]], auth: KafkaAuth | None
) -> Child:
    java, *rest = _java(workdir)
    options = auth.jvm_options() if auth is not None else []
    argv = [java, *options, *rest, "kafka.Kafka", str(config)]
    return spawn("kafka", wrap(argv), log=workdir / "kafka.log")


def _wait_kafka(kafka: Kafka) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "socket.timeout.ms": 2000, "log_level": 0})

    def ready() -> bool:
        try:
            return bool(admin.list_topics(timeout=2).brokers)
        except Exception:  # the client's KafkaException while the broker starts
            return False

    wait_until("kafka", ready, process=kafka.process, timeout=120)


def start_kafka(
    workdir: Path,
    *,
    listeners: KafkaListeners | None = None,
    wrap: Callable[[list[str]], list[str]] = lambda argv: argv,
    auth: KafkaAuth | None = None,
) -> Kafka:
    """Format a fresh KRaft log directory and start the broker (replication factors 1).

    By default it listens on free loopback ports; `wrap` runs its JVM some other way
    (inside the test cluster's namespace, say), `listeners` says where it listens then.
    With `auth` it also listens where `auth` says, authenticating every client there.
    """
    import base64
    import uuid

    workdir.mkdir(parents=True, exist_ok=True)
    listeners = listeners or KafkaListeners.loopback(auth)
    config = workdir / "server.properties"
    config.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                *listeners.properties(),
                "controller.listener.names=CONTROLLER",
                f"log.dirs={workdir / 'kafka-logs'}",
                "num.partitions=1",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=4",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "transaction.state.log.num.partitions=4",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=false",
            ]
        )
        + "\n"
    )
    cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    formatted = subprocess.run(
        [
            *_java(workdir),
            *("kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(config)),
            *(listeners.auth.format_arguments() if listeners.auth is not None else []),
        ],
        capture_output=True,
        text=True,
    )
    if formatted.returncode != 0:
        raise ServerError(f"kafka storage format failed:\n{formatted.stdout}{formatted.stderr}")
    kafka = Kafka(_kafka_process(workdir, config, wrap, listeners.auth), listeners, config, workdir, wrap)
    _wait_kafka(kafka)
    return kafka


REGISTRY_VERSION = "2.4.2.Final"
"""Apicurio Registry's release (scripts/install-servers.sh builds it)."""


@dataclass
class SchemaRegistry:
    """Apicurio Registry with in-memory storage on loopback; `url` is its Confluent-compatible API."""

    process: Child
    port: int
    https: bool

    @property
    def url(self) -> str:
        """The base URL of the Confluent API (what a connector's `schemaRegistry.url` names)."""
        return f"{'https' if self.https else 'http'}://127.0.0.1:{self.port}/apis/ccompat/v7"

    def stop(self) -> None:
        """Stop the JVM by PID."""
        self.process.stop()


@dataclass(frozen=True)
class RegistryOidc:
    """An OIDC provider (the tests' Hydra) whose tokens a registry requires: it checks them with the
    provider's keys, and exchanges a client's HTTP basic credentials (an OAuth client's id and secret,
    as Confluent clients send them) for one (Apicurio's basic-auth-client-credentials)."""

    url: str
    """The provider's base URL (Hydra's public port)."""
    ca: Path
    """The CA that signed its certificate."""


def _oidc_settings(workdir: Path, oidc: RegistryOidc) -> list[str]:
    """The registry's settings to require the tokens of `oidc`, its CA in a trust store made here."""
    trust, password = workdir / "trust.p12", "nopstream-test"  # a store of one public certificate
    keytool = ["keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", str(oidc.ca),
               "-keystore", str(trust), "-storetype", "PKCS12", "-storepass", password]  # fmt: skip
    subprocess.run(keytool, check=True, capture_output=True, timeout=60)
    trusted = [
        f"trust-store-file={trust}",
        f"trust-store-password={password}",
        "trust-store-file-type=PKCS12",
    ]
    return [
        "registry.auth.enabled=true",
        "registry.auth.basic-auth-client-credentials.enabled=true",
        f"quarkus.oidc.auth-server-url={oidc.url}",
        # Hydra's discovery names its issuer's host, which nothing here resolves: its keys by address
        "quarkus.oidc.discovery-enabled=false",
        f"quarkus.oidc.jwks-path={oidc.url}/.well-known/jwks.json",
        f"quarkus.oidc.token.issuer={OAUTH_ISSUER}",
        # Apicurio asks for the token at the endpoint with "/" appended, which Hydra does not serve
        # (/oauth2/token/): a query takes the slash
        f"registry.auth.token.endpoint={oidc.url}/oauth2/token?via=registry",
        "quarkus.oidc.tls.verification=required",
        *(f"quarkus.oidc.tls.trust-store-{setting}" for setting in trusted),
        # the token exchange's own client trusts what the JVM does
        f"javax.net.ssl.trustStore={trust}", f"javax.net.ssl.trustStorePassword={password}",
        "javax.net.ssl.trustStoreType=PKCS12",
    ]  # fmt: skip


def start_schema_registry(
    workdir: Path, *, serving: KeyPair | None = None, oidc: RegistryOidc | None = None
) -> SchemaRegistry:
    """Start the registry on a free port: plain HTTP, or with `serving` HTTPS only (its certificate
    and key); with `oidc`, every call must be authenticated (HTTP basic or a bearer token)."""
    jar = CACHE / f"schema-registry-{REGISTRY_VERSION}" / "schema-registry-1-runner.jar"
    if not jar.is_file():
        raise ServerError("the schema registry is not built: run scripts/install-servers.sh registry")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    settings = ["quarkus.http.host=127.0.0.1", "quarkus.log.level=WARN"]
    if serving is None:
        settings.append(f"quarkus.http.port={port}")
    else:  # the plain port is bound too, and refuses every request
        settings += [
            f"quarkus.http.port={free_port()}",
            f"quarkus.http.ssl-port={port}",
            f"quarkus.http.ssl.certificate.files={serving.cert}",
            f"quarkus.http.ssl.certificate.key-files={serving.key}",
            "quarkus.http.insecure-requests=disabled",
        ]
    if oidc is not None:
        settings += _oidc_settings(workdir, oidc)
    # a small heap and the client JIT, as the broker's: ready in about 4 s, ~230 MB resident
    argv = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
    argv += [f"-D{s}" for s in settings] + ["-jar", str(jar)]
    process = spawn("schema-registry", argv, log=workdir / "registry.log", cwd=workdir)
    registry = SchemaRegistry(process, port, serving is not None)

    def ready() -> bool:
        context = None
        if serving is not None:
            import ssl

            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only: is it up
        try:
            with urllib.request.urlopen(f"{registry.url}/subjects", timeout=2, context=context) as answer:
                return bool(answer.status == 200)
        except urllib.error.HTTPError as err:  # it answers: up (with `oidc`, no call without a token)
            return oidc is not None and err.code == 401

    wait_until("schema registry", ready, process=registry.process, timeout=90)
    return registry


@contextlib.contextmanager
def running(server: Etcd | Minio) -> Iterator[Etcd | Minio]:
    """Yield a started server and stop it by PID afterwards."""
    try:
        yield server
    finally:
        server.stop()
