"""Shared helpers: the repository root and the `nopstream` command as a real process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

if TYPE_CHECKING:
    from e2e.cluster import Cluster

from nopstream.checkpoint.epochs import EpochCoordinator, Trigger
from nopstream.checkpoint.storage import LocalStorage
from nopstream.cluster.backend import Backend
from nopstream.cluster.election import Election
from nopstream.cluster.epochlog import EpochLog, LeaderLog
from nopstream.cluster.layout import Layout
from nopstream.cluster.leases import LeaseKeeper
from nopstream.node.wire.coordinator_api import CoordinatorRoutes
from nopstream.plan.compiler import CompiledPlans

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Result:
    """What one run of the command gave."""

    code: int
    out: str
    err: str


def run_nopstream(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 120
) -> Result:
    """Run `python -m nopstream ARGS` as its own OS process, on this checkout."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "operator"), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-m", "nopstream", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


DASHBOARD_LINE = re.compile(r"dashboard: http://127\.0\.0\.1:\d+/dashboard/#token=[0-9a-f]{64}\n")


def after_dashboard_line(err: str) -> str:
    """What `nopstream run` wrote to stderr after the dashboard's address, its first line."""
    first, _, rest = err.partition("\n")
    assert DASHBOARD_LINE.fullmatch(first + "\n"), f"no dashboard address first: {err!r}"
    return rest


@contextlib.asynccontextmanager
async def serving(routes: CoordinatorRoutes) -> AsyncIterator[str]:
    """A coordinator's routes served on a loopback port (guarded) for the block; their base URL."""
    app = routes.guard.application()
    routes.add_to(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def nothing(*args: object) -> None:
    """A trigger or notify that does nothing (no tasks)."""


async def led_coordinator(
    plans: CompiledPlans,
    backend: Backend,
    keeper: LeaseKeeper,
    storage: Path,
    *,
    run: int,
    trigger: Trigger = nothing,
) -> EpochCoordinator:
    """The epoch coordinator of run `run` of `plans`, with its real epoch log on `backend`, local
    storage at `storage` and a leadership won with `keeper`'s lease; commits notify no one."""
    ident = plans.partitioned.identity
    layout = Layout("local", ident.job_id, ident.pipeline_id)
    return EpochCoordinator(
        plans.partitioned,
        LocalStorage(str(storage)),
        LeaderLog(EpochLog(backend, layout), await Election(backend, layout, "c").campaign(keeper)),
        settings=plans.deployment.checkpoint,
        trigger=trigger,
        notify=nothing,
        run=run,
    )


def s3_records(client: Any, bucket: str, prefix: str) -> Counter[str]:
    """The JSON-lines records of every object under a prefix, as a multiset (canonical JSON)."""
    out: Counter[str] = Counter()
    for obj in client.list_objects(bucket, prefix=prefix):
        body = client.get_object(bucket, obj.object_name)
        try:
            out.update(json.dumps(json.loads(line), sort_keys=True) for line in body.read().splitlines())
        finally:
            body.close()
            body.release_conn()
    return out


@pytest.fixture
def nopstream():
    """The command runner, as a fixture."""
    return run_nopstream


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory):
    """A real etcd server shared by the session; tests use their own key prefixes."""
    from e2e import servers

    server = servers.start_etcd(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def minio_server(tmp_path_factory):
    """A real MinIO server shared by the session; each test gets its own bucket."""
    from e2e import servers

    server = servers.start_minio(tmp_path_factory.mktemp("minio"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory):
    """A real PostgreSQL 15 server shared by the session (prepared transactions enabled)."""
    from e2e import servers

    server = servers.start_postgres(tmp_path_factory.mktemp("postgres"))
    yield server
    server.close()


@pytest.fixture
def database(postgres_server, request, monkeypatch):
    """A fresh database for this test on the session's server; its sink password in the environment."""
    import re
    import secrets

    import psycopg

    name = re.sub(r"[^a-z0-9]", "_", request.node.name.lower())[:40] + "_" + secrets.token_hex(3)
    with psycopg.connect(postgres_server.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    monkeypatch.setenv("NOPSTREAM_POSTGRES_PASSWORD", postgres_server.password)
    return name


KUBE_GROUP = "kube"
_kube = contextlib.ExitStack()
"""The running kube cluster, closed after the last test of its group (`pytest_runtest_teardown`)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """Stop the kube cluster once the test after this one is not of its group: the group's tests run
    one after another on one worker, and an idle cluster took a share of this 2-core machine's CPU from
    every test after them until the session ended."""
    yield
    if nextitem is not None and _group(item) == KUBE_GROUP != _group(nextitem):
        _kube.close()
        _kube_stopped.append(item.nodeid)


_kube_stopped: list[str] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test of the kube group that comes after the cluster stopped (the group was split)."""
    if _kube_stopped and _group(item) == KUBE_GROUP:
        pytest.fail(
            f"the kube cluster stopped after {_kube_stopped[0]}: the 'kube' group was not kept together"
        )


def _group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker and marker.args else None


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory):
    """The two-node Kubernetes cluster (`e2e/cluster.py`) shared by the session, in its own namespace.

    One per test run: the tests that use it are one xdist group. Were they spread over
    the workers (pytest-xdist#1386 did that silently), each would start a cluster of its
    own, twice the load on the machine; the second fails here instead. It stops after the
    group's last test (a test of the group after that fails here too).
    """
    import fcntl

    from e2e.cluster import Cluster
    from e2e.traces import machine_state

    run = tmp_path_factory.getbasetemp()  # an xdist worker's is popen-gwN inside the run's
    with (run.parent if "PYTEST_XDIST_WORKER" in os.environ else run).joinpath("kube.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.fail(
                "another xdist worker runs the kube cluster: the 'kube' xdist group is not kept together"
            )
        with _kube:
            workdir, before, started = tmp_path_factory.mktemp("kube"), machine_state(), []
            _kube.callback(lambda: _left_as_it_was(before, workdir, started))  # after the cluster stopped
            started.append(cluster := _kube.enter_context(Cluster.start(workdir)))
            # the check can see a cluster: the nodes' cgroup roots are there while it runs
            assert machine_state()["cgroups"] != before["cgroups"]
            yield cluster


def _left_as_it_was(before: dict[str, object], workdir: Path, started: list[Cluster]) -> None:
    """Fail the test whose teardown stopped the cluster when it left anything on this machine:
    a mount, link, iptables rule, cgroup or process, or a namespace holder of it or of a node."""
    from e2e.traces import left_behind

    holders = [n.ns.holder.pid for c in started for n in c.nodes] + [c.ns.holder.pid for c in started]
    if found := left_behind(before, workdir, holders):
        raise AssertionError("the stopped kube cluster left this machine changed:\n" + "\n".join(found))


KAFKA_USERS = {"app": secrets.token_hex(12), "reader": secrets.token_hex(12)}
"""The SCRAM and PLAIN users of the session's broker, and their passwords."""


@pytest.fixture(scope="session")
def kafka_server(tmp_path_factory):
    """A real single-node Kafka broker (KRaft) shared by the session; each test makes its topics.

    Besides its PLAINTEXT listener it authenticates clients on a SASL_SSL and an SSL listener
    (`KAFKA_USERS`; `tests/connectors/test_kafka_security.py`)."""
    from e2e import servers
    from e2e.certs import Pki

    base = tmp_path_factory.mktemp("kafka")
    auth = servers.KafkaAuth.issue(Pki(base / "pki"), KAFKA_USERS)
    server = servers.start_kafka(base / "broker", auth=auth)
    yield server
    import gc

    gc.collect()  # clients the tests left are destroyed before the broker goes (no reconnect noise)
    server.stop()


@pytest.fixture(scope="session")
def hydra(kafka_server, tmp_path_factory):
    """Ory Hydra, started by the first test that asks (about a second), signing its access tokens with
    the key the session's broker trusts for OAUTHBEARER (`e2e.identity`)."""
    from e2e import identity, servers

    auth = kafka_server.auth
    serving = auth.pki.issue("hydra", "127.0.0.1", server_names=("localhost",), server_ips=("127.0.0.1",))
    base = tmp_path_factory.mktemp("hydra")
    binary = servers.binary("hydra")
    server = identity.start_hydra(base, binary=binary, serving=serving, ca=auth.ca, key=auth.signing)
    yield server
    server.stop()


@pytest.fixture
def kafka(kafka_server, request):
    """Topics and records on the session's broker for this test (`tests/kafka_util.py`)."""
    from tests.kafka_util import Topics

    return Topics(kafka_server.bootstrap, request.node.name)


@pytest.fixture
def minio_client(minio_server):
    """A `minio.Minio` client for the session's server."""
    from minio import Minio

    return Minio(
        minio_server.endpoint,
        access_key=minio_server.access_key,
        secret_key=minio_server.secret_key,
        secure=False,
    )


@pytest.fixture
def bucket(minio_client, request):
    """A fresh bucket for this test, named after it."""
    import re
    import secrets

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{name}-{secrets.token_hex(3)}"
    minio_client.make_bucket(name)
    return name


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory):
    """A real schema registry (Apicurio Registry, Confluent API) shared by the session; tests use
    subjects of their own."""
    from e2e import servers

    server = servers.start_schema_registry(tmp_path_factory.mktemp("registry"))
    yield server
    server.stop()


REGISTRY_CLIENT = ("schemas-app", secrets.token_hex(12))
"""The OAuth client (id, secret) whose HTTP basic credentials `secured_registry` takes."""


@pytest.fixture(scope="session")
def secured_registry(hydra, kafka_server, tmp_path_factory):
    """A second registry, started by the tests that ask: it takes only calls authenticated by the
    session's Hydra, HTTP basic as `REGISTRY_CLIENT` among them (a JVM more: not the shared one)."""
    from e2e import servers

    hydra.client(*REGISTRY_CLIENT, "", method="client_secret_post")  # Apicurio posts it in the form
    oidc = servers.RegistryOidc(f"https://127.0.0.1:{hydra.public}", kafka_server.auth.ca)
    server = servers.start_schema_registry(tmp_path_factory.mktemp("secured-registry"), oidc=oidc)
    yield server
    server.stop()


@pytest.fixture
def registry(schema_registry):
    """The session's schema registry as the test's own client (`tests/registry_util.py`) sees it."""
    from tests.registry_util import Registry

    return Registry(schema_registry.url)
