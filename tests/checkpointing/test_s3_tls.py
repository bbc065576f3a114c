"""Checkpoints on a MinIO that serves TLS only, verified against the CA in the credentials directory.

The CA comes from `ca.crt` beside `accessKey` and `secretKey` (a mounted Secret's keys);
without it, or over plain HTTP, the job is refused at its start with the reason, and
nothing is written.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import urllib3
import yaml
from minio import Minio

from e2e import servers
from e2e.certs import Pki
from tests.conftest import ROOT, run_nopstream

COUNT = 2000
BUCKET = "tls-checkpoints"


@pytest.fixture(scope="module")
def tls_minio(tmp_path_factory):
    """(the server, its CA file), a bucket BUCKET made."""
    workdir = tmp_path_factory.mktemp("tls-minio")
    pki = Pki(workdir / "pki")
    server = servers.start_minio(workdir, pki=pki)
    client = Minio(
        server.endpoint,
        access_key=server.access_key,
        secret_key=server.secret_key,
        secure=True,
        http_client=urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(pki.ca.cert)),
    )
    client.make_bucket(BUCKET)
    yield server, pki.ca.cert, client
    server.stop()


def job(home: Path, job_id: str, endpoint: str) -> None:
    model = {
        "jobId": job_id,
        "parallelism": 2,
        "checkpoint": {"intervalMs": 200, "storage": {"s3": {"endpoint": endpoint, "bucket": BUCKET}}},
        "model": {
            "sources": [{"id": "n", "type": "generator", "config": {"count": COUNT, "ratePerSecond": 2000}}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    (home / "job.yaml").write_text(yaml.safe_dump(model))


def credentials(home: Path, server: servers.Minio, ca: Path | None) -> dict[str, str]:
    keys = home / "s3-credentials"
    keys.mkdir()
    (keys / "accessKey").write_text(server.access_key)
    (keys / "secretKey").write_text(server.secret_key)
    if ca is not None:
        shutil.copy(ca, keys / "ca.crt")
    return {"PYTHONPATH": str(ROOT), "NOPSTREAM_S3_CREDENTIALS": str(keys)}


def test_checkpoints_on_an_s3_endpoint_over_tls_verified_by_the_mounted_ca(tls_minio, tmp_path):
    server, ca, client = tls_minio
    job(tmp_path, "over-tls", server.url)
    ran = run_nopstream("run", "job.yaml", "--quiet", cwd=tmp_path, env=credentials(tmp_path, server, ca))
    assert ran.code == 0, ran
    lines = [line for f in (tmp_path / "out").glob("*.jsonl") for line in f.read_text().split()]
    assert Counter(json.loads(line) for line in lines) == Counter(range(COUNT))
    names = [
        o.object_name for o in client.list_objects(BUCKET, prefix="checkpoint/over-tls/", recursive=True)
    ]
    assert any(name.endswith("/_manifest.json") for name in names), names


@pytest.mark.parametrize("case", ["no CA", "plain http"])
def test_an_unverified_or_plain_endpoint_is_refused_at_the_start(tls_minio, tmp_path, case):
    server, _, client = tls_minio
    job_id = case.lower().replace(" ", "-")
    endpoint = server.url if case == "no CA" else f"http://{server.endpoint}"
    job(tmp_path, job_id, endpoint)
    ran = run_nopstream("run", "job.yaml", "--quiet", cwd=tmp_path, env=credentials(tmp_path, server, None))
    reason = (
        "CERTIFICATE_VERIFY_FAILED" if case == "no CA" else "Client sent an HTTP request to an HTTPS server"
    )
    assert ran.code == 3 and ran.err.startswith(f"job '{job_id}' cannot start: cannot "), ran
    assert reason in ran.err and "Traceback" not in ran.err, ran.err
    assert list(client.list_objects(BUCKET, prefix=f"checkpoint/{job_id}/", recursive=True)) == []
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
