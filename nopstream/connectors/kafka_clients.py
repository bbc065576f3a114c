"""The Kafka clients of the `kafka` connectors (confluent-kafka), configured for their cluster's
security, and the check at start that turns a connection no retry can mend into a refusal.

librdkafka never raises on a failed login or handshake: it reports each one to an error callback
and keeps retrying, and a metadata request only times out. `reach` asks for metadata in short
turns and serves the callback between them, so a wrong password, an untrusted certificate or a
client certificate the broker rejects is refused within a second, in librdkafka's words.
"""

from __future__ import annotations

import re
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import ClusterMetadata

from nopstream.connectors.credentials import password, tls_paths
from nopstream.errors import StartRefused
from nopstream.model.connectors import KafkaConnection, KafkaTls

PASSWORD_ENV = "NOPSTREAM_KAFKA_PASSWORD"
TIMEOUT = 30.0  # seconds for a metadata request, init_transactions or a commit
QUIET = {"log_level": 3}  # librdkafka logs errors only; they come back as exceptions too


def client_config(c: KafkaConnection) -> dict[str, Any]:
    """librdkafka's settings that reach and authenticate to the cluster of `c`."""
    config: dict[str, Any] = {
        "bootstrap.servers": c.bootstrap_servers,
        "security.protocol": c.security_protocol,
        **QUIET,
    }
    if c.sasl is not None:
        secret = password(c.secret_ref, PASSWORD_ENV)
        config["sasl.mechanism"] = c.sasl.mechanism
        if c.sasl.mechanism == "OAUTHBEARER":
            config |= {
                "sasl.oauthbearer.method": "oidc",
                "sasl.oauthbearer.client.id": c.sasl.username,
                "sasl.oauthbearer.client.secret": secret,
                "sasl.oauthbearer.token.endpoint.url": c.sasl.token_endpoint,
                **({"sasl.oauthbearer.scope": c.sasl.scope} if c.sasl.scope else {}),
            }
            if c.sasl.token_endpoint_ca_file is not None:
                config["https.ca.location"] = c.sasl.token_endpoint_ca_file
        else:
            config |= {"sasl.username": c.sasl.username, "sasl.password": secret}
    if c.security_protocol.endswith("SSL"):
        tls = c.tls or KafkaTls()
        ca, cert, key = tls_paths(tls, c.secret_ref)
        config["ssl.endpoint.identification.algorithm"] = "https" if tls.verify_hostname else "none"
        if ca is not None:
            config["ssl.ca.location"] = ca
        if cert is not None and key is not None:
            config |= {"ssl.certificate.location": cert, "ssl.key.location": key}
    return config


def consumer(c: KafkaConnection, **extra: Any) -> Consumer:
    """A read_committed consumer that commits nothing by itself; a group only when `extra` names one."""
    # librdkafka wants a group.id; without one of ours no group is joined or committed to
    config = {
        "group.id": "nopstream-unused",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    }
    return Consumer({**client_config(c), **config, **extra})


def admin(c: KafkaConnection) -> AdminClient:
    """An admin client of the cluster of `c`."""
    return AdminClient(client_config(c))


class _Refusals:
    """The error callback of a client: keeps the first failure that no retry mends."""

    def __init__(self) -> None:
        self.first: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        said = error.str()
        refusing = error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL) or (
            # the broker ended the handshake over our certificate (bad, unknown, expired, missing)
            error.code() == KafkaError._TRANSPORT and "SSL alert" in said
        )
        if refusing and self.first is None:
            self.first = error


def _words(error: KafkaError) -> str:
    """librdkafka's message without the broker's address in front and the timing behind."""
    said = re.sub(r"^\S+://\S+?/\S+: ", "", error.str())
    return re.sub(r" \(after \d+ms in state \w+\)$", "", said)


def reach(c: KafkaConnection, topic: str | None = None) -> ClusterMetadata:
    """The cluster's metadata (of `topic` alone when given), asked until TIMEOUT; StartRefused in one
    line for a client librdkafka cannot build (a file it cannot read) or a login or handshake that
    failed."""
    refusals = _Refusals()
    who = f"user {c.sasl.username} ({c.sasl.mechanism})" if c.sasl is not None else "the client"
    try:
        config: dict[str, Any] = {**client_config(c), "error_cb": refusals}
        client = AdminClient(config)
    except KafkaException as err:
        raise StartRefused(f"kafka at {c.bootstrap_servers}: {err.args[0].str()}") from None
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            return client.list_topics(topic, timeout=1.0)
        except KafkaException:
            client.poll(0.1)  # serves the error callback
            if refusals.first is not None:
                raise StartRefused(
                    f"kafka at {c.bootstrap_servers} refused {who}: {_words(refusals.first)}"
                ) from None
            if time.monotonic() > deadline:
                raise
