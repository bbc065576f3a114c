"""Kafka jobs on a broker that authenticates every client: SASL_SSL (SCRAM-SHA-256/512, PLAIN) and
SSL with client certificates, each exact; every wrong credential or certificate refused at start in
one line, nothing published, the password said nowhere.

The session's broker (`tests/conftest.py`, `e2e.servers.KafkaAuth`) also keeps a PLAINTEXT listener,
which only the test uses to create and read topics.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from e2e.certs import Pki
from tests.chaos.jobs import fill_kafka
from tests.checkpointing.test_faults import prepare, run_job
from tests.conftest import KAFKA_USERS, run_nopstream
from tests.connectors.test_kafka_job import model, rolling_counts
from tests.kafka_util import Topics

PASSWORD = KAFKA_USERS["app"]


@pytest.fixture
def secured(kafka_server, kafka):
    """The session broker's listeners that authenticate, and the test's topics (made on its PLAINTEXT one)."""
    return kafka_server.auth, kafka


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
def test_a_job_over_authenticated_connections_is_exact(reading, writing, tmp_path, secured):
    auth, topics = secured
    source = fill_kafka(topics, random.Random(3), lines=600)
    out = topics.create("out", partitions=2)
    prepare(tmp_path / "job", secured_job(topics, source, out, reading(auth), writing(auth)), {})
    result = run_job(tmp_path / "job", env=ENV)
    assert result.returncode == 0, result.stderr
    assert topics.committed(out) == rolling_counts(topics, source, lines=600)
    # the password is in no file the job wrote (plan, checkpoints, logs) and in none of its output
    written = b"".join(p.read_bytes() for p in (tmp_path / "job").rglob("*") if p.is_file())
    assert PASSWORD.encode() not in written + (result.stdout + result.stderr).encode()


OAUTH_CLIENT, OAUTH_SECRET = "nopstream-app", "client-secret-of-the-app"


def oauth(auth, hydra) -> dict:
    """A connection over SASL_SSL with OAUTHBEARER: a token Hydra grants the app (client credentials)."""
    return {
        "bootstrapServers": auth.sasl_bootstrap,
        "securityProtocol": "SASL_SSL",
        "sasl": {
            "mechanism": "OAUTHBEARER",
            "username": OAUTH_CLIENT,
            "tokenEndpoint": hydra.token_endpoint,
            "tokenEndpointCaFile": str(hydra.ca),
            "scope": "kafka",
        },
        "tls": {"caFile": str(auth.ca)},
    }


@pytest.fixture(scope="module")
def oauth_client(hydra):
    """The app's OAuth client in Hydra (once per module: a client id is registered once)."""
    hydra.client(OAUTH_CLIENT, OAUTH_SECRET, "kafka")
    return hydra


def test_a_job_over_oauthbearer_with_tokens_of_a_real_identity_provider_is_exact(
    tmp_path, secured, oauth_client
):
    """Both ends authenticate with a JWT that Ory Hydra grants (client credentials over HTTPS),
    verified by the broker's JWKS validator (signature, issuer, expiry): exact, the secret said nowhere."""
    auth, topics = secured
    source = fill_kafka(topics, random.Random(5), lines=400)
    out = topics.create("out", partitions=2)
    connection = oauth(auth, oauth_client)
    prepare(tmp_path / "job", secured_job(topics, source, out, connection, connection), {})
    result = run_job(tmp_path / "job", env={"NOPSTREAM_KAFKA_PASSWORD": OAUTH_SECRET})
    assert result.returncode == 0, result.stderr
    assert topics.committed(out) == rolling_counts(topics, source, lines=400)
    written = b"".join(p.read_bytes() for p in (tmp_path / "job").rglob("*") if p.is_file())
    assert OAUTH_SECRET.encode() not in written + (result.stdout + result.stderr).encode()


def test_a_wrong_client_secret_or_an_untrusted_token_endpoint_is_refused_at_start(
    tmp_path, secured, oauth_client
):
    auth, topics = secured
    connection = oauth(auth, oauth_client)
    wrong = {"NOPSTREAM_KAFKA_PASSWORD": "not-" + OAUTH_SECRET}
    line = _refused(tmp_path / "secret", topics, connection, mtls(auth), wrong)
    assert f"kafka at {auth.sasl_bootstrap} refused user {OAUTH_CLIENT} (OAUTHBEARER): " in line, line
    assert 'Failed to acquire SASL OAUTHBEARER token: {"error":"invalid_client",' in line, line
    other = Pki(tmp_path / "other").ca.cert
    untrusted = {**connection, "sasl": {**connection["sasl"], "tokenEndpointCaFile": str(other)}}
    line = _refused(
        tmp_path / "ca", topics, untrusted, mtls(auth), {"NOPSTREAM_KAFKA_PASSWORD": OAUTH_SECRET}
    )
    assert f"kafka at {auth.sasl_bootstrap} refused user {OAUTH_CLIENT} (OAUTHBEARER): " in line, line
    assert "certificate" in line.lower(), line


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


def test_a_wrong_password_is_refused_at_start_without_saying_it(tmp_path, secured):
    auth, topics = secured
    wrong = {"NOPSTREAM_KAFKA_PASSWORD": "not-" + PASSWORD}
    line = _refused(tmp_path, topics, sasl(auth, "SCRAM-SHA-256"), mtls(auth), wrong)
    assert (
        f"kafka at {auth.sasl_bootstrap} refused user app (SCRAM-SHA-256): SASL authentication error:" in line
    )
    assert "invalid credentials with SASL mechanism SCRAM-SHA-256" in line, line


def test_a_broker_certificate_of_an_untrusted_ca_is_refused_at_start(tmp_path, secured):
    auth, topics = secured
    other = Pki(tmp_path / "other")
    line = _refused(tmp_path, topics, mtls(auth), sasl(auth, "SCRAM-SHA-512", caFile=str(other.ca.cert)), ENV)
    assert f"kafka at {auth.sasl_bootstrap} refused user app (SCRAM-SHA-512): SSL handshake failed:" in line
    assert "certificate verify failed" in line, line


def test_an_expired_client_certificate_is_refused_at_start(tmp_path, secured):
    auth, topics = secured
    expired = auth.pki.issue("expired-client", "nopstream", expired=True)
    line = _refused(tmp_path, topics, mtls(auth, expired), mtls(auth), ENV)
    assert f"kafka at {auth.ssl_bootstrap} refused the client:" in line
    assert "ssl/tls alert certificate unknown" in line, line


def test_no_client_certificate_where_the_broker_requires_one_is_refused_at_start(tmp_path, secured):
    auth, topics = secured
    bare = {**mtls(auth), "tls": {"caFile": str(auth.ca)}}
    line = _refused(tmp_path, topics, mtls(auth), bare, ENV)
    assert f"kafka at {auth.ssl_bootstrap} refused the client:" in line
    assert "ssl/tls alert" in line, line


def test_a_ca_file_that_is_not_there_is_refused_at_start(tmp_path, secured):
    auth, topics = secured
    line = _refused(
        tmp_path, topics, sasl(auth, "SCRAM-SHA-256", caFile=str(tmp_path / "no-ca.crt")), mtls(auth), ENV
    )
    assert f"kafka at {auth.sasl_bootstrap}: Failed to create admin client: ssl.ca.location failed" in line, (
        line
    )


def test_security_settings_that_do_not_fit_their_protocol_are_invalid(tmp_path):
    """Checked before anything connects, each naming its field; a password has no field to be put in."""
    connection = {"bootstrapServers": "kafka:9093", "topic": "t"}
    configs = [
        {**connection, "sasl": {"mechanism": "PLAIN", "username": "u"}},
        {**connection, "securityProtocol": "SASL_SSL"},
        {**connection, "securityProtocol": "SASL_SSL", "sasl": {"mechanism": "OAUTHBEARER", "username": "u"}},
        {**connection, "tls": {"caFile": "ca.crt"}},
        {**connection, "securityProtocol": "SSL", "tls": {"certFile": "c.crt"}, "password": "hunter2"},
        {**connection, "secretRef": "../../etc"},
    ]
    sources = [{"id": f"s{i}", "type": "kafka", "config": c} for i, c in enumerate(configs)]
    sink = {"id": "out", "type": "file", "inputs": [s["id"] for s in sources], "config": {"path": "out"}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"jobId": "bad", "model": {"sources": sources, "sinks": [sink]}}))
    result = run_nopstream("validate", str(job))
    assert result.code == 1
    assert result.err.splitlines()[1:] == [
        "  model.sources[0].config: Value error, securityProtocol PLAINTEXT takes no sasl (it needs SASL_SSL"
        " or SASL_PLAINTEXT) (rule: schema)",
        "  model.sources[1].config: Value error, securityProtocol SASL_SSL needs sasl (rule: schema)",
        "  model.sources[2].config.sasl: Value error, tokenEndpoint is given exactly when the mechanism is"
        " OAUTHBEARER (rule: schema)",
        "  model.sources[3].config: Value error, tls needs securityProtocol SSL or SASL_SSL, not PLAINTEXT"
        " (rule: schema)",
        "  model.sources[4].config.password: unknown field (rule: known-fields)",
        "  model.sources[4].config.tls: Value error, certFile and keyFile go together: a client certificate"
        " and its private key (rule: schema)",
        "  model.sources[5].config.secretRef: String should match pattern"
        " '^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$' (rule: schema)",
    ]


def test_the_password_is_in_no_view_of_a_running_job(tmp_path, secured):
    """While a SASL job runs, its dashboard's view of the job, the dashboard page and its metrics hold
    the job (its sources' names) and never the password."""
    import re
    import time
    import urllib.request

    from tests.checkpointing.test_faults import start_job

    auth, topics = secured
    source = fill_kafka(topics, random.Random(6), lines=3000)
    out = topics.create("out", partitions=2)
    workdir = tmp_path / "job"
    prepare(workdir, secured_job(topics, source, out, sasl(auth, "SCRAM-SHA-512"), mtls(auth)), {})
    proc = start_job(workdir, env=ENV)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        found = re.fullmatch(r"dashboard: (http://127\.0\.0\.1:\d+)/dashboard/#token=([0-9a-f]{64})\n", first)
        assert found, first
        base, token = found.groups()
        seen = ""
        deadline = time.monotonic() + 60
        while '"lines"' not in seen and time.monotonic() < deadline:  # the view shows the source
            time.sleep(0.2)
            seen = ""
            for path in ("/api/v1/job", "/metrics", "/dashboard/"):
                request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
                with urllib.request.urlopen(request, timeout=5) as answer:
                    seen += answer.read().decode()
        assert '"lines"' in seen and "nopstream_" in seen, seen[:500]
        assert PASSWORD not in seen
        rest = proc.stderr.read()
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == 0, rest
    assert PASSWORD not in first + rest
