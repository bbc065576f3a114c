"""Kafka jobs on a broker that authenticates every client: SASL_SSL (SCRAM-SHA-256/512, PLAIN) and
SSL with client certificates, each exact; every wrong credential or certificate refused at start in
one line, nothing published, the password said nowhere.

The broker (`e2e.servers.KafkaAuth`) also keeps a PLAINTEXT listener, which only the test uses to
create and read topics.
"""

from __future__ import annotations

import random
import secrets
from pathlib import Path

import pytest

from e2e.certs import Pki
from tests.chaos.jobs import fill_kafka
from tests.checkpointing.test_faults import prepare, run_job
from tests.connectors.test_kafka_job import model, rolling_counts
from tests.kafka_util import Topics

PASSWORD = secrets.token_hex(12)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A broker with SASL_SSL and SSL listeners (users `app` and `reader`), and its PKI."""
    from e2e import servers

    base = tmp_path_factory.mktemp("kafka-auth")
    pki = Pki(base / "pki")
    auth = servers.KafkaAuth.issue(pki, {"app": PASSWORD, "reader": "reader-" + PASSWORD})
    server = servers.start_kafka(base / "kafka", auth=auth)
    yield server, auth, pki
    server.stop()


@pytest.fixture
def topics(secured, request) -> Topics:
    """Topics on the broker's PLAINTEXT listener."""
    return Topics(secured[0].bootstrap, request.node.name)


def sasl(auth, mechanism: str, **tls) -> dict:
    """A connection over SASL_SSL as `app`, verifying the broker against the CA."""
    return {
        "bootstrapServers": auth.sasl_bootstrap,
        "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": mechanism, "username": "app"},
        "tls": {"caFile": str(auth.ca), **tls},
    }


def mtls(auth, cert=None) -> dict:
    """A connection over SSL with the client certificate `cert` (the broker's client's by default)."""
    cert = cert or auth.client
    return {
        "bootstrapServers": auth.ssl_bootstrap,
        "securityProtocol": "SSL",
        "tls": {"caFile": str(auth.ca), "certFile": str(cert.cert), "keyFile": str(cert.key)},
    }


def secured_job(topics: Topics, source: str, out: str, reading: dict, writing: dict) -> dict:
    """`test_kafka_job`'s rolling word count, its source connecting with `reading`, its sink `writing`."""
    job = model(topics, source, out)
    (src,), (sink,) = job["model"]["sources"], job["model"]["sinks"]
    src["config"] = {**src["config"], **reading}
    sink["config"] = {**sink["config"], **writing}
    return job


ENV = {"NOPSTREAM_KAFKA_PASSWORD": PASSWORD}


@pytest.mark.parametrize(
    "reading, writing",
    [
        (lambda a: sasl(a, "SCRAM-SHA-512"), lambda a: mtls(a)),
        (lambda a: sasl(a, "PLAIN"), lambda a: sasl(a, "SCRAM-SHA-256")),
    ],
    ids=["scram512-to-mtls", "plain-to-scram256"],
)
def test_a_job_over_authenticated_connections_is_exact(reading, writing, tmp_path, secured, topics):
    _, auth, _ = secured
    source = fill_kafka(topics, random.Random(3), lines=600)
    out = topics.create("out", partitions=2)
    prepare(tmp_path / "job", secured_job(topics, source, out, reading(auth), writing(auth)), {})
    result = run_job(tmp_path / "job", env=ENV)
    assert result.returncode == 0, result.stderr
    assert topics.committed(out) == rolling_counts(topics, source, lines=600)


def _refused(tmp_path: Path, topics: Topics, reading: dict, writing: dict, env: dict[str, str]) -> str:
    """Run the job; assert it was refused at start in one line, nothing published, no password said;
    that line."""
    source = fill_kafka(topics, random.Random(4), lines=50)
    out = topics.create("out", partitions=2)
    workdir = tmp_path / "job"
    prepare(workdir, secured_job(topics, source, out, reading, writing), {})
    result = run_job(workdir, env=env)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "recovering: " not in result.stderr, result.stderr
    assert not topics.committed(out)
    logs = "".join(p.read_text(errors="replace") for p in workdir.rglob("*.log"))
    for password in env.values():
        assert password not in result.stderr + result.stdout + logs
    (line,) = [line for line in result.stderr.splitlines() if "kafka at " in line]
    return line


def test_a_wrong_password_is_refused_at_start_without_saying_it(tmp_path, secured, topics):
    _, auth, _ = secured
    wrong = {"NOPSTREAM_KAFKA_PASSWORD": "not-" + PASSWORD}
    line = _refused(tmp_path, topics, sasl(auth, "SCRAM-SHA-256"), mtls(auth), wrong)
    assert (
        f"kafka at {auth.sasl_bootstrap} refused user app (SCRAM-SHA-256): SASL authentication error:" in line
    )
    assert "invalid credentials with SASL mechanism SCRAM-SHA-256" in line, line


def test_a_broker_certificate_of_an_untrusted_ca_is_refused_at_start(tmp_path, secured, topics):
    _, auth, _ = secured
    other = Pki(tmp_path / "other")
    line = _refused(tmp_path, topics, mtls(auth), sasl(auth, "SCRAM-SHA-512", caFile=str(other.ca.cert)), ENV)
    assert f"kafka at {auth.sasl_bootstrap} refused user app (SCRAM-SHA-512): SSL handshake failed:" in line
    assert "certificate verify failed" in line, line


def test_an_expired_client_certificate_is_refused_at_start(tmp_path, secured, topics):
    _, auth, pki = secured
    expired = pki.issue("expired-client", "nopstream", expired=True)
    line = _refused(tmp_path, topics, mtls(auth, expired), mtls(auth), ENV)
    assert f"kafka at {auth.ssl_bootstrap} refused the client:" in line
    assert "ssl/tls alert certificate unknown" in line, line


def test_no_client_certificate_where_the_broker_requires_one_is_refused_at_start(tmp_path, secured, topics):
    _, auth, _ = secured
    bare = {**mtls(auth), "tls": {"caFile": str(auth.ca)}}
    line = _refused(tmp_path, topics, mtls(auth), bare, ENV)
    assert f"kafka at {auth.ssl_bootstrap} refused the client:" in line
    assert "ssl/tls alert" in line, line


def test_a_ca_file_that_is_not_there_is_refused_at_start(tmp_path, secured, topics):
    _, auth, _ = secured
    line = _refused(
        tmp_path, topics, sasl(auth, "SCRAM-SHA-256", caFile=str(tmp_path / "no-ca.crt")), mtls(auth), ENV
    )
    assert f"kafka at {auth.sasl_bootstrap}: Failed to create admin client: ssl.ca.location failed" in line, (
        line
    )
