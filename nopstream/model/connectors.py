"""The config schema of every connector type (`model/catalogue.py` lists the types).

The model layer holds them so that validation can check a job without importing any
connector code.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    Field,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    model_validator,
)

from nopstream.model.connector_config import ConnectorConfig
from nopstream.model.formats import ObjectFormatName, ObjectSinkFormatConfig, ObjectSourceFormatConfig

SECRET_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
S3_BUCKET = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
"""An S3 bucket name: 3 to 63 lowercase letters, digits, dots and hyphens, a letter or digit at each end."""
"""A Kubernetes Secret's name (a DNS subdomain)."""


class FileSourceConfig(ObjectSourceFormatConfig):
    """Files matching a glob, read as text, JSON or CSV lines (each spread over the subtasks in stripes)
    or as Parquet (row groups spread over the subtasks)."""

    path: str
    format: ObjectFormatName = "text"
    discovery_interval_ms: StrictInt | None = Field(None, ge=1, le=86_400_000)


class IndexedSourceConfig(ConnectorConfig):
    """A source of records by index, in `splits` splits numbered at compile time (None: one per subtask)."""

    splits: StrictInt | None = Field(None, ge=1, le=1024)


class GeneratorSourceConfig(IndexedSourceConfig):
    """A deterministic generator: the same config always yields the same records."""

    kind: Literal["sequence", "words", "events"] = "sequence"
    count: StrictInt | None = Field(None, ge=0, le=10**12)
    seed: StrictInt = Field(0, ge=-(2**63), le=2**63 - 1)
    rate_per_second: StrictFloat | None = Field(None, gt=0, le=1e9)
    vocabulary: StrictInt = Field(10_000, ge=1, le=10**7)
    words_per_line: StrictInt = Field(10, ge=1, le=1000)
    keys: StrictInt = Field(100, ge=1, le=10**9)


MAX_COLLECTION = 100_000
"""The most records a `collection` source lists: they travel inside the plan to every task."""


class CollectionSourceConfig(IndexedSourceConfig):
    """Records listed in the model (JSON values), read in `splits` splits: a job's tests' input."""

    records: list[JsonValue] = Field(max_length=MAX_COLLECTION)
    splits: StrictInt | None = Field(1, ge=1, le=1024)


class S3SourceConfig(ObjectSourceFormatConfig):
    """Objects under a bucket prefix, read as text, JSON or CSV lines or as Parquet."""

    bucket: str = Field(pattern=S3_BUCKET)
    prefix: str = ""
    endpoint: str | None = None
    secret_ref: str | None = Field(None, pattern=SECRET_NAME)
    format: ObjectFormatName = "text"


SECRETS_DIR = "/var/run/secrets/nopstream"
"""Where a pod finds the Kubernetes Secret a connector's `secretRef` names: `{SECRETS_DIR}/{name}/{key}`."""

KAFKA_TOPIC = r"^[A-Za-z0-9._-]{1,249}$"
"""A Kafka topic name."""


class TlsFiles(ConnectorConfig):
    """The PEM files of a TLS client: the CA the server is verified against, and a client certificate
    with its key for a server that asks for one.

    Files on the machine that runs the task; on a cluster, the connector's Secret
    (`secretRef`) may hold them instead as `ca.crt`, `tls.crt` and `tls.key`.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @model_validator(mode="after")
    def _certificate_with_its_key(self) -> TlsFiles:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("certFile and keyFile go together: a client certificate and its private key")
        return self


class KafkaTls(TlsFiles):
    """TLS to the brokers (protocol SSL or SASL_SSL): verified against `caFile` (the system's CAs
    without one), the broker's name checked unless `verifyHostname` is false."""

    verify_hostname: StrictBool = True


class KafkaSasl(ConnectorConfig):
    """SASL authentication (protocol SASL_SSL or SASL_PLAINTEXT). The password (OAUTHBEARER: the
    client secret) is the key `password` of the `secretRef` Secret on a cluster, else
    NOPSTREAM_KAFKA_PASSWORD; never in the model."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
    username: str = Field(min_length=1, max_length=1000)
    """The user; for OAUTHBEARER the OAuth client id."""
    token_endpoint: str | None = Field(None, pattern=r"^https?://")
    """OAUTHBEARER: the OIDC token endpoint that grants the client its token (client credentials)."""
    scope: str | None = None
    """OAUTHBEARER: the scope asked for."""
    token_endpoint_ca_file: str | None = None
    """OAUTHBEARER: the CA the token endpoint's certificate is verified against (the system's without)."""

    @model_validator(mode="after")
    def _oauth_has_an_endpoint(self) -> KafkaSasl:
        if (self.mechanism == "OAUTHBEARER") != (self.token_endpoint is not None):
            raise ValueError("tokenEndpoint is given exactly when the mechanism is OAUTHBEARER")
        if self.token_endpoint_ca_file is not None and self.token_endpoint is None:
            raise ValueError("tokenEndpointCaFile goes with tokenEndpoint (mechanism OAUTHBEARER)")
        return self


class KafkaConnection(ConnectorConfig):
    """How a Kafka client reaches and authenticates to its cluster (librdkafka's `security.protocol`)."""

    bootstrap_servers: str = Field(min_length=1)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl: KafkaSasl | None = None
    tls: KafkaTls | None = None
    secret_ref: str | None = Field(None, pattern=SECRET_NAME)
    """The Secret holding `password` and, for TLS, `ca.crt`, `tls.crt`, `tls.key` (mounted on a cluster)."""

    @model_validator(mode="after")
    def _protocol_has_its_settings(self) -> KafkaConnection:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl != (self.sasl is not None):
            needs = "needs sasl" if sasl else "takes no sasl (it needs SASL_SSL or SASL_PLAINTEXT)"
            raise ValueError(f"securityProtocol {self.security_protocol} {needs}")
        if self.tls is not None and not self.security_protocol.endswith("SSL"):
            raise ValueError(f"tls needs securityProtocol SSL or SASL_SSL, not {self.security_protocol}")
        return self


REGISTRY_FORMATS = ("avro", "protobuf", "json-schema")
"""Kafka value formats framed with a schema id (the Confluent wire format) and kept in a registry."""


class SchemaRegistry(ConnectorConfig):
    """A schema registry that speaks the Confluent API (Confluent's, Apicurio's `/apis/ccompat/v7`,
    Karapace). An `https` URL is verified against `tls.caFile` (the system's CAs without one) and may
    present `tls.certFile` with its key."""

    url: str = Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=2000)
    tls: TlsFiles | None = None
    username: str | None = Field(None, min_length=1, max_length=1000)
    """HTTP basic authentication as this user (Confluent Cloud: the API key; Apicurio: an OAuth client
    it exchanges for a token). The password is the key `registry-password` of the connector's
    `secretRef` Secret on a cluster, else NOPSTREAM_REGISTRY_PASSWORD; never in the model."""

    @model_validator(mode="after")
    def _tls_needs_https(self) -> SchemaRegistry:
        if self.tls is not None and not self.url.startswith("https://"):
            raise ValueError("tls needs an https url")
        if "@" in self.url.split("/")[2]:
            raise ValueError(
                "url names a user: give it as username, its password in the connector's Secret"
                " (key registry-password) or NOPSTREAM_REGISTRY_PASSWORD, never in the model"
            )
        return self


class KafkaPayload(ConnectorConfig):
    """How message values read: `json`, `string`, `bytes` (base64 text in records), or a schema the
    registry holds: `avro`, `protobuf`, `json-schema`, framed with its id (the Confluent wire format)."""

    format: Literal["json", "string", "bytes", "avro", "protobuf", "json-schema"] = "json"
    schema_registry: SchemaRegistry | None = None

    @model_validator(mode="after")
    def _registry_for_its_formats(self) -> KafkaPayload:
        framed = self.format in REGISTRY_FORMATS
        if framed and self.schema_registry is None:
            raise ValueError(f"format {self.format} needs schemaRegistry (its schemas are kept there)")
        if not framed and self.schema_registry is not None:
            raise ValueError(
                f"schemaRegistry goes with format avro, protobuf or json-schema, not {self.format}"
            )
        return self


class KafkaSourceConfig(KafkaConnection, KafkaPayload):
    """The partitions of a topic (or of the topics `topicPattern` matches in full), read
    `read_committed`; one split per partition, offsets in checkpoints.

    `startingOffsets` applies to a fresh job only (a restored one resumes at its offsets);
    `bounded` stops at the end offsets the job first saw (they are checkpointed, so a
    restart stops at the same place). Record timestamps are the Kafka timestamps.
    """

    topic: str | None = Field(None, pattern=KAFKA_TOPIC)
    topic_pattern: str | None = Field(None, min_length=1, max_length=1000)
    starting_offsets: Literal["earliest", "latest", "timestamp"] = "earliest"
    start_timestamp_ms: StrictInt | None = Field(None, ge=0)
    bounded: StrictBool = False
    discovery_interval_ms: StrictInt | None = Field(None, ge=100)

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSourceConfig:
        if (self.topic is None) == (self.topic_pattern is None):
            raise ValueError("needs exactly one of topic or topicPattern")
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as err:
                raise ValueError(f"topicPattern is not a regular expression: {err}") from None
        if (self.starting_offsets == "timestamp") != (self.start_timestamp_ms is not None):
            raise ValueError("startTimestampMs is given exactly when startingOffsets is timestamp")
        return self


class SchemaReference(ConnectorConfig):
    """A schema `valueSchema` imports (a Protobuf `import`, an Avro named type, a JSON Schema `$ref`):
    the name it imports it by, and the registry subject's version that holds it."""

    name: str = Field(min_length=1, max_length=1000)
    subject: str = Field(min_length=1, max_length=1000)
    version: StrictInt = Field(ge=1)


class KafkaSinkConfig(KafkaConnection, KafkaPayload):
    """A topic that receives each durable epoch's records in one Kafka transaction (OUTBOX_EPOCH_LOG).

    `keyField` names the record field written as the message key; `topicField` the
    field naming each record's topic (the `topic` otherwise). With a registry format,
    values are written with `valueSchema` (registered under `subject` at start, as the
    registry's compatibility rule allows) or, without one, the subject's latest schema.
    """

    topic: str = Field(pattern=KAFKA_TOPIC)
    key_field: str | None = None
    topic_field: str | None = None
    transaction_timeout_ms: StrictInt = Field(60_000, ge=1000, le=900_000)
    value_schema: str | None = Field(None, min_length=1, max_length=1_000_000)
    """The schema's text: Avro JSON, a JSON Schema document, or a `.proto` file."""
    subject: str | None = Field(None, min_length=1, max_length=1000)
    """The registry subject of the values (`<topic>-value` unless named: TopicNameStrategy)."""
    message: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")
    """Protobuf: the full name of the message written (the schema's first message unless named)."""
    references: list[SchemaReference] = Field(default_factory=list, max_length=100)
    """The schemas `valueSchema` imports, registered with it."""

    @model_validator(mode="after")
    def _schema_settings_fit(self) -> KafkaSinkConfig:
        if self.references and self.value_schema is None:
            raise ValueError("references go with valueSchema (the schemas it imports)")
        if self.format not in REGISTRY_FORMATS:
            given = [n for n, v in (("valueSchema", self.value_schema), ("subject", self.subject)) if v]
            if given:
                raise ValueError(
                    f"{given[0]} goes with format avro, protobuf or json-schema, not {self.format}"
                )
        if self.message is not None and self.format != "protobuf":
            raise ValueError(f"message goes with format protobuf, not {self.format}")
        if self.topic_field is not None and self.format in REGISTRY_FORMATS and self.subject is None:
            raise ValueError("topicField with a registry format needs subject (one schema for every topic)")
        return self

    def value_subject(self) -> str:
        """The registry subject of the values."""
        return self.subject or f"{self.topic}-value"

    def location(self) -> str:
        """The topic on its cluster."""
        return f"kafka topic '{self.topic}' at {self.bootstrap_servers}"


class FileSinkConfig(ObjectSinkFormatConfig):
    """A directory that receives one committed file per sink subtask and epoch."""

    path: str

    def location(self) -> str:
        """The directory as given (a relative one is resolved by whoever knows the working directory)."""
        return self.path


class S3SinkConfig(ObjectSinkFormatConfig):
    """A bucket prefix that receives objects published on commit."""

    bucket: str = Field(pattern=S3_BUCKET)
    prefix: str = ""
    endpoint: str | None = None
    secret_ref: str | None = Field(None, pattern=SECRET_NAME)

    def location(self) -> str:
        """The bucket prefix on its endpoint."""
        return f"s3://{self.bucket}/{self.prefix}" + (f" at {self.endpoint}" if self.endpoint else "")


SQL_NAME = r"^[a-z_][a-z0-9_]{0,62}$"
"""A PostgreSQL identifier as nopstream writes it: lower case, unquoted, at most 63 bytes."""

SQL_TABLE = r"^([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$"
"""A table as nopstream names it: an identifier (`SQL_NAME`), with its schema in front or not."""


class PostgresTls(TlsFiles):
    """TLS to a PostgreSQL server (libpq's `sslmode`): the CA file its certificate is verified
    against, and a client certificate and key for a server that asks for one; on a cluster the
    `secretRef` Secret's `ca.crt`, `tls.crt` and `tls.key` may hold them instead. Without `tls` the
    connection is libpq's default (TLS when the server offers it, unverified)."""

    mode: Literal["require", "verify-ca", "verify-full"] = "verify-full"


class PostgresConnection(ConnectorConfig):
    """A PostgreSQL server, database and user. The password is the key `password` of the Secret
    `secretRef` names, mounted on a cluster (`SECRETS_DIR`), else NOPSTREAM_POSTGRES_PASSWORD; the
    server checks it with SCRAM or MD5, as its pg_hba.conf says. `tls` verifies the server
    (`PostgresTls`)."""

    host: str = "127.0.0.1"
    port: StrictInt = Field(5432, ge=1, le=65535)
    database: str = Field(pattern=r"^[^\s]{1,63}$")
    user: str = Field(pattern=r"^[^\s]{1,63}$")
    secret_ref: str | None = Field(None, pattern=SECRET_NAME)
    tls: PostgresTls | None = None


class PostgresSinkConfig(PostgresConnection):
    """A table that receives each epoch's rows in one prepared transaction (TWO_PHASE_COMMIT).

    Each record is a mapping whose fields fill `columns` by name (a missing field is
    NULL); `upsert` replaces the row of the same `keys` (ON CONFLICT ... DO UPDATE).
    """

    table: str = Field(pattern=SQL_TABLE)
    columns: list[str] = Field(min_length=1, max_length=1600)
    mode: Literal["insert", "upsert"] = "insert"
    keys: list[str] | None = None

    def rows_replace_by_key(self) -> bool:
        """Upsert replaces a key's row."""
        return self.mode == "upsert"

    def location(self) -> str:
        """The table in its database."""
        return f"postgresql table {self.table} in {self.database} at {self.host}:{self.port}"

    @model_validator(mode="after")
    def _keys_name_columns(self) -> PostgresSinkConfig:
        bad = [c for c in self.columns + (self.keys or []) if not re.match(SQL_NAME, c)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a column name (lower-case letters, digits, '_')")
        if len(set(self.columns)) != len(self.columns):
            raise ValueError("a column is named twice")
        if self.mode == "upsert" and not self.keys:
            raise ValueError("mode upsert needs keys: the columns of the table's unique key")
        missing = [k for k in self.keys or [] if k not in self.columns]
        if missing:
            raise ValueError(f"key {missing[0]!r} is not one of the columns")
        if self.keys and self.mode != "upsert":
            raise ValueError("keys apply to mode upsert only")
        return self


class PostgresCdcSourceConfig(PostgresConnection):
    """The row changes of a publication's tables, read from a logical replication slot (pgoutput):
    one split, read by the source's first subtask.

    The slot is created at the job's first start when it does not exist (the job reads what
    commits after that), and kept: the server holds the WAL the slot has not been told is read,
    which is told once the epoch that read it is durable. The publication is created `FOR TABLE`
    `tables` when it does not exist. `bounded` stops at the end of the WAL as the first start
    saw it (checkpointed, so a restart stops at the same place). `snapshot: initial` reads the
    tables as they were when the slot began first, each row a change of op `read`
    (`connectors.cdc_snapshot`); `never`, the default, reads changes only. `endMarker` stops after
    the transaction holding the first logical decoding message of that prefix, emitted with
    `pg_logical_emit_message(true, '<endMarker>', '')`: an end the writer of the changes chooses.
    """

    slot: str = Field(pattern=r"^[a-z0-9_]{1,63}$")
    publication: str = Field(pattern=SQL_NAME)
    tables: list[str] | None = Field(None, min_length=1)
    bounded: StrictBool = False
    snapshot: Literal["initial", "never"] = "never"
    end_marker: str | None = Field(None, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _tables_are_names(self) -> PostgresCdcSourceConfig:
        bad = [t for t in self.tables or [] if not re.match(SQL_TABLE, t)]
        if bad:
            raise ValueError(
                f"{bad[0]!r} is not a table name (schema.table, lower-case letters, digits, '_')"
            )
        if self.bounded and self.end_marker is not None:
            raise ValueError("bounded and endMarker are two ends: give one")
        return self


class StdoutSinkConfig(ConnectorConfig):
    """Standard output of the task process."""

    format: Literal["jsonl", "text"] = "jsonl"
