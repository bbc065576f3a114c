"""A job coordinated through an etcd that speaks TLS only and checks who calls (`NOPSTREAM_ETCD_ACCESS`).

The etcd here admits clients with a certificate of its CA (`--client-cert-auth`) and has
authentication on: the user `nopstream`, a client certificate's common name, may read
and write every key; any other name may do nothing. `nopstream run --etcd` with the
access directory ends with exactly its input; a plain client, a client of another name
and a malformed access directory are refused, each with its reason.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import yaml

from e2e import servers
from e2e.certs import Pki
from nopstream.cluster.backend import StoreRefused, StoreUnavailable
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.etcd_access import ACCESS_ENV, read_access
from tests.conftest import ROOT, run_nopstream

COUNT = 3000


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory):
    """(the server, its PKI): TLS only, client certificates checked, authentication on."""
    workdir = tmp_path_factory.mktemp("secure-etcd")
    pki = Pki(workdir / "pki")
    server = servers.start_secure_etcd(workdir, pki, password="job-password")
    yield server, pki
    server.stop()


def test_a_job_coordinated_through_an_etcd_with_tls_and_authentication_is_exact(secure_etcd, tmp_path):
    server, pki = secure_etcd
    host, port = server.endpoint
    access = pki.etcd_access(tmp_path / "etcd-access", servers.SECURE_ETCD_USER)
    job = {
        "jobId": "secured",
        "parallelism": 2,
        "checkpoint": {"intervalMs": 200, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [{"id": "n", "type": "generator", "config": {"count": COUNT, "ratePerSecond": 1500}}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    env = {"PYTHONPATH": str(ROOT), ACCESS_ENV: str(access)}
    ran = run_nopstream("run", "job.yaml", "--quiet", "--etcd", f"{host}:{port}", cwd=tmp_path, env=env)
    assert ran.code == 0, ran
    out = Counter(
        json.loads(line) for f in (tmp_path / "out").glob("*.jsonl") for line in f.read_text().split()
    )
    assert out == Counter(range(COUNT))
    # the job's coordination is in this etcd: read back as its user
    found = asyncio.run(_keys(host, port, access))
    assert any("/secured/" in key for key in found), sorted(found)[:5]


async def _keys(host: str, port: int, access: Path) -> list[str]:
    backend = EtcdBackend(host, port, access=read_access(access))
    try:
        return list(await backend.get_prefix("/"))
    finally:
        await backend.close()


def test_a_plain_client_and_one_of_another_name_are_refused(secure_etcd, tmp_path):
    server, pki = secure_etcd
    host, port = server.endpoint
    stranger = read_access(pki.etcd_access(tmp_path / "stranger", "stranger"))

    async def attempt(backend: EtcdBackend) -> None:
        try:
            await backend.put("/nopstream-test/key", b"v")
        finally:
            await backend.close()

    with pytest.raises(StoreUnavailable):  # no TLS: the server closes the connection
        asyncio.run(attempt(EtcdBackend(host, port, timeout=3)))
    with pytest.raises(StoreRefused, match=r"etcd refused this client \(etcdserver: permission denied\)"):
        asyncio.run(attempt(EtcdBackend(host, port, timeout=3, access=stranger)))


@pytest.mark.parametrize("who", ["another name", "a wrong password"])
def test_a_job_whose_etcd_user_is_refused_cannot_start_and_leaves_no_secret(secure_etcd, tmp_path, who):
    server, pki = secure_etcd
    host, port = server.endpoint
    name = "stranger" if who == "another name" else servers.SECURE_ETCD_USER
    access = pki.etcd_access(tmp_path / "access", name)
    if who == "a wrong password":
        (access / "username").write_text(servers.SECURE_ETCD_USER)
        (access / "password").write_text("not-the-password")
    job = {
        "jobId": "refused-user",
        "model": {
            "sources": [{"id": "n", "type": "generator", "config": {"count": 10}}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    env = {"PYTHONPATH": str(ROOT), ACCESS_ENV: str(access)}
    ran = run_nopstream("run", "job.yaml", "--quiet", "--etcd", f"{host}:{port}", cwd=tmp_path, env=env)
    said = {
        "another name": "etcdserver: permission denied",
        "a wrong password": "etcdserver: authentication failed, invalid user ID or password",
    }[who]
    assert (ran.code, ran.err) == (
        3,
        f"job 'refused-user' cannot start: etcd refused this client ({said}): the user of its certificate"
        " or username needs read and write on the keys under /nopstream/\n",
    )
    left = sorted(p.name for p in (tmp_path / ".nopstream" / "runs" / "refused-user" / "cluster").iterdir())
    assert left == ["plans"]  # the secret and the TLS key are gone with the command
    assert not (tmp_path / "out").exists()


def test_a_malformed_access_directory_is_refused_before_the_job_starts(secure_etcd, tmp_path):
    server, pki = secure_etcd
    host, port = server.endpoint
    (tmp_path / "job.yaml").write_text(
        yaml.safe_dump(
            {
                "jobId": "refused",
                "model": {
                    "sources": [{"id": "n", "type": "generator"}],
                    "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
                },
            }
        )
    )
    half = pki.etcd_access(tmp_path / "half", servers.SECURE_ETCD_USER)
    os.remove(half / "tls.key")
    missing = tmp_path / "missing"
    cases = {
        str(missing): f"{missing}: not a directory (it holds ca.crt, tls.crt, tls.key, username, password)",
        str(half): f"{half}: tls.crt and tls.key go together (one of them is missing)",
    }
    for directory, why in cases.items():
        env = {"PYTHONPATH": str(ROOT), ACCESS_ENV: directory}
        ran = run_nopstream("run", "job.yaml", "--etcd", f"{host}:{port}", cwd=tmp_path, env=env)
        assert (ran.code, ran.err) == (2, f"nopstream run: {ACCESS_ENV}: {why}\n"), ran
        assert not (tmp_path / "cp").exists() and not (tmp_path / ".nopstream").exists()
