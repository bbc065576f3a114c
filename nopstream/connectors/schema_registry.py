"""A client of a schema registry's Confluent API, and the wire format of the values it frames.

Wire format: byte 0, the schema id (4 bytes, big-endian), for Protobuf the path of the
message in its file (zig-zag varints: a count, then the indexes; a lone 0 is the first
message), then the encoded value. The client keeps what it has read (a schema id never
changes its schema) and speaks HTTP with the standard library: a handful of calls do not
need another dependency.
"""

from __future__ import annotations

import base64
import json
import random
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from nopstream.connectors import credentials
from nopstream.errors import StartRefused
from nopstream.model.connectors import SchemaReference, SchemaRegistry

TIMEOUT = 10.0
"""Seconds for one call to the registry."""

REGISTER_TRIES = 5
"""Tries of a registration that meets a conflict or a server error (two subtasks racing)."""

KINDS = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}
"""The registry's name of each format's schema type."""

PASSWORD_ENV = "NOPSTREAM_REGISTRY_PASSWORD"
PASSWORD_KEY = "registry-password"
"""Where the password of `schemaRegistry.username` is: this key of the connector's Secret, else this
variable."""

_JSON = "application/vnd.schemaregistry.v1+json"


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry keeps it: its id, its type (AVRO, PROTOBUF, JSON), its text and the
    schemas it imports."""

    id: int
    kind: str
    text: str
    references: tuple[SchemaReference, ...] = ()


def _registered(schema_id: int, answer: dict[str, Any]) -> RegisteredSchema:
    """A schema of the registry's answer (of /schemas/ids/ or /subjects/.../versions/)."""
    references = tuple(
        SchemaReference(name=str(r["name"]), subject=str(r["subject"]), version=int(r["version"]))
        for r in answer.get("references") or []
    )
    return RegisteredSchema(schema_id, answer.get("schemaType") or "AVRO", answer["schema"], references)


class RegistryUnreachable(OSError):
    """The registry did not answer, or answered with a server error: worth trying again later."""


class RegistryRefused(Exception):
    """The registry answered no (an unknown id or subject, an invalid or incompatible schema)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SchemaRegistryClient:
    """The registry one connector uses; schemas by id are read once."""

    def __init__(self, config: SchemaRegistry, secret_ref: str | None = None) -> None:
        """A client of `config.url`, over TLS as `config.tls` says for an https URL, as `config.username`
        with the password of the `secret_ref` Secret (mounted) or PASSWORD_ENV."""
        self.url = config.url.rstrip("/")
        self.username = config.username
        self.secret_ref = secret_ref
        self._context: ssl.SSLContext | None = None
        if self.url.startswith("https://"):
            tls = config.tls
            ca, cert, key = credentials.tls_paths(tls, None) if tls is not None else (None, None, None)
            self._context = ssl.create_default_context(cafile=ca)
            if cert is not None:
                self._context.load_cert_chain(cert, key)
        self._headers = {"Content-Type": _JSON, "Accept": _JSON}
        self._password = ""
        if config.username is not None:
            self._password = credentials.password(secret_ref, PASSWORD_ENV, PASSWORD_KEY)
            basic = base64.b64encode(f"{config.username}:{self._password}".encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {basic}"
        self._by_id: dict[int, RegisteredSchema] = {}

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer of one call; RegistryRefused for a 4xx, RegistryUnreachable for the rest."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT, context=self._context) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as err:
            text = err.read().decode("utf-8", errors="replace")
            try:
                message = str(json.loads(text).get("message") or text)
            except (ValueError, AttributeError):
                message = text
            message = (
                f"HTTP {err.code}: {message.strip()[:500]}"
                if message.strip()
                else f"HTTP {err.code} {err.reason}"
            )
            if 400 <= err.code < 500:
                raise RegistryRefused(err.code, message) from None
            raise RegistryUnreachable(message) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = err.reason if isinstance(err, urllib.error.URLError) else err
            raise RegistryUnreachable(str(reason)) from None

    def reach(self, who: str) -> None:
        """Ask for the subjects once; StartRefused naming `who` and the registry when that fails."""
        registry = f"{who}: schema registry at {self.url}"
        if self.username is not None and not self._password:
            where = f"the key {PASSWORD_KEY} of Secret '{self.secret_ref}' or " if self.secret_ref else ""
            raise StartRefused(f"{registry}: user '{self.username}' has no password ({where}{PASSWORD_ENV})")
        try:
            self._call("GET", "/subjects")
        except RegistryRefused as err:
            if err.status in (401, 403):
                who_asked = (
                    f"user '{self.username}'" if self.username is not None else "a client without a username"
                )
                raise StartRefused(f"{registry} refused {who_asked}: {err}") from None
            raise StartRefused(f"{registry} cannot be used: {err}") from None
        except RegistryUnreachable as err:
            raise StartRefused(f"{registry} cannot be used: {err}") from None

    def by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema of an id (RegistryRefused when the registry has none)."""
        found = self._by_id.get(schema_id)
        if found is None:
            found = self._by_id[schema_id] = _registered(
                schema_id, self._call("GET", f"/schemas/ids/{schema_id}")
            )
        return found

    def imports(self, references: tuple[SchemaReference, ...]) -> dict[str, str]:
        """The text of each referenced schema and of every one they reference in turn, by the name it
        is imported by (RegistryRefused when the registry has one not)."""
        found: dict[str, str] = {}
        todo = list(references)
        while todo:
            reference = todo.pop()
            if reference.name in found:
                continue
            path = f"/subjects/{_quoted(reference.subject)}/versions/{reference.version}"
            answer = self._call("GET", path)
            found[reference.name] = answer["schema"]
            todo += _registered(int(answer["id"]), answer).references
        return found

    def register(
        self, subject: str, kind: str, text: str, references: tuple[SchemaReference, ...] = ()
    ) -> int:
        """The id of `text` (importing `references`) under `subject`, registered as a new version when
        the subject has it not (the registry checks its compatibility rule; RegistryRefused when it says
        no)."""
        body: dict[str, Any] = {"schema": text, "schemaType": kind}
        if references:
            body["references"] = [r.model_dump() for r in references]
        for attempt in range(1, REGISTER_TRIES + 1):
            try:
                answer = self._call("POST", f"/subjects/{_quoted(subject)}/versions", body)
                break
            except (RegistryRefused, RegistryUnreachable) as err:
                # the sink's subtasks register at once, and a registration is idempotent: Apicurio
                # answers one that races another for a new subject or content with 409 "already
                # exists" or a 500 of its unique keys; asked again, it finds what the other made. An
                # incompatible schema (409 again) stays refused, an absent registry unreachable.
                if (isinstance(err, RegistryRefused) and err.status != 409) or attempt == REGISTER_TRIES:
                    raise
                time.sleep(0.2 * attempt * random.uniform(0.5, 1.5))  # apart: racing again would lose again
        schema_id = int(answer["id"])
        self._by_id[schema_id] = RegisteredSchema(schema_id, kind, text, references)
        return schema_id

    def latest(self, subject: str) -> RegisteredSchema:
        """The subject's latest schema."""
        answer = self._call("GET", f"/subjects/{_quoted(subject)}/versions/latest")
        found = self._by_id[int(answer["id"])] = _registered(int(answer["id"]), answer)
        return found


def _quoted(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


def frame(schema_id: int, payload: bytes, indexes: bytes = b"") -> bytes:
    """A value in the wire format (`indexes`: a Protobuf message's encoded path, else empty)."""
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes + payload


def unframe(value: bytes) -> tuple[int, bytes]:
    """The schema id and the rest of a framed value; ValueError when it is not framed."""
    if len(value) < 5 or value[0] != 0:
        raise ValueError("it does not start with byte 0 and a 4-byte schema id")
    return int.from_bytes(value[1:5], "big"), value[5:]


def message_path(indexes: list[int]) -> bytes:
    """The wire form of a Protobuf message's path in its file."""
    if indexes == [0]:
        return b"\x00"
    return b"".join(_varint(_zigzag(n)) for n in (len(indexes), *indexes))


def read_message_path(data: bytes) -> tuple[list[int], bytes]:
    """A Protobuf message's path in its file and the message's bytes after it."""
    count, at = _read_varint(data, 0)
    count = _unzigzag(count)
    if count == 0:
        return [0], data[at:]
    indexes = []
    for _ in range(count):
        n, at = _read_varint(data, at)
        indexes.append(_unzigzag(n))
    return indexes, data[at:]


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("its Protobuf message path is cut short")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at
