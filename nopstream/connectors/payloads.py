"""Kafka message values as records and back, in each format a Kafka connector names.

`json`, `string` and `bytes` need nothing else. `avro`, `protobuf` and `json-schema`
values carry the id of their schema (`schema_registry`): a reader decodes each value with
the schema it names (Avro with fastavro, JSON Schema validated with jsonschema, Protobuf
with the protobuf runtime after protoc, in-process from grpcio-tools, compiled the
registry's `.proto` text), the schemas its references name at hand (a Protobuf import, an
Avro named type, a JSON Schema `$ref`); a writer encodes with the one schema it registered
or looked up at start.

Records cross channels as JSON, so values become what JSON holds: Avro and Protobuf
bytes are base64 text, Avro decimals decimal text, Protobuf enums their names and 64-bit
integers numbers; Avro's date and time logical types stay the numbers they are encoded as
(epoch days, milliseconds, microseconds), as an event-time field wants them. An Avro
writer takes the same forms back (`avro_forms`): what a reader gave is written to the same bytes.

A value that does not decode or does not fit its schema raises `PayloadError` (a bad
record: `onError` decides); a registry that does not answer raises `RegistryUnreachable`
(the task is recovered and asks again).
"""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Protocol

import fastavro
import jsonschema
import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from nopstream.connectors import avro_forms
from nopstream.connectors.schema_registry import (
    KINDS,
    RegistryRefused,
    SchemaRegistryClient,
    frame,
    message_path,
    read_message_path,
    unframe,
)
from nopstream.errors import StartRefused
from nopstream.model.connectors import REGISTRY_FORMATS, KafkaPayload, KafkaSinkConfig


class PayloadError(ValueError):
    """A value that does not decode, or a record that does not fit the schema it is written with."""


class SchemaError(ValueError):
    """A schema that its format's library does not take."""


class ValueCodec(Protocol):
    """Message values of one format as records and back."""

    def decode(self, value: bytes) -> Any:
        """The record of a value (PayloadError when it does not decode)."""
        ...

    def encode(self, record: Any) -> bytes:
        """The value of a record (PayloadError when it does not fit)."""
        ...


class PlainCodec:
    """`json` (parsed), `string` (UTF-8 text) or `bytes` (base64 text: records cross channels as JSON)."""

    def __init__(self, fmt: str) -> None:
        """A codec of format `fmt`."""
        self.format = fmt

    def decode(self, value: bytes) -> Any:
        """Parsed JSON, UTF-8 text, or the bytes as base64 text."""
        try:
            if self.format == "json":
                return orjson.loads(value)
            if self.format == "bytes":
                return base64.b64encode(value).decode("ascii")
            return value.decode("utf-8")
        except ValueError as err:  # not UTF-8 (UnicodeDecodeError), not JSON (JSONDecodeError)
            form = "JSON" if self.format == "json" else "UTF-8 text"
            raise PayloadError(
                f"is not {form} ({err}) (rule: a source of format {self.format} reads {form} values)"
            ) from None

    def encode(self, record: Any) -> bytes:
        """The record as JSON, as UTF-8 text when it is text and the format is `string`, or the bytes
        its base64 text holds (`bytes`)."""
        if self.format == "bytes":
            if not isinstance(record, str):
                raise PayloadError(
                    f"is {type(record).__name__}, not base64 text (rule: format bytes writes base64 text)"
                )
            try:
                return base64.b64decode(record, validate=True)
            except ValueError as err:
                raise PayloadError(
                    f"is not base64 text ({err}) (rule: format bytes writes base64 text)"
                ) from None
        if self.format == "string" and isinstance(record, str):
            return record.encode("utf-8")
        return orjson.dumps(record)


class Schema(Protocol):
    """One registered schema's reader and writer of payloads (the value after the framing)."""

    def read(self, payload: bytes) -> Any:
        """The record of a payload."""
        ...

    def write(self, record: Any) -> bytes:
        """The payload of a record (its framing prefix included for Protobuf's message path)."""
        ...


class AvroSchema:
    """An Avro schema (fastavro)."""

    def __init__(self, text: str, imports: dict[str, str] | None = None) -> None:
        """Parse the schema's JSON text, its date and time logical types read as their numbers, the named
        types of the schemas it `imports` (their texts by name) at hand."""
        self.named: dict[str, Any] = {}
        texts = dict(imports or {})
        while texts:  # each import once the ones it names are parsed
            parsed = {name: t for name, t in texts.items() if _parses(t, self.named)}
            if not parsed:
                raise SchemaError(f"not an Avro schema: its references {sorted(texts)} do not parse")
            texts = {name: t for name, t in texts.items() if name not in parsed}
        self.parsed = _parse_avro(text, self.named)
        every = [text, *(imports or {}).values()]
        self._plain = any(t in x for x in every for t in ('"bytes"', '"fixed"', '"decimal"', '"uuid"'))

    def read(self, payload: bytes) -> Any:
        """Decode one value; every byte must belong to it."""
        buffer = io.BytesIO(payload)
        try:
            record = fastavro.schemaless_reader(buffer, self.parsed, None)
        except (EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError) as err:
            raise PayloadError(f"does not decode with its Avro schema: {err or type(err).__name__}") from None
        left = len(payload) - buffer.tell()
        if left:
            raise PayloadError(f"has {left} bytes left after the value its Avro schema reads")
        return avro_forms.json_ready(record) if self._plain else record

    def write(self, record: Any) -> bytes:
        """Encode one record (bytes, fixed and decimals as `read` gives them: base64 and decimal text)."""
        if self._plain:
            record = avro_forms.avro_ready(self.parsed, record, self.named)
        buffer = io.BytesIO()
        try:
            fastavro.schemaless_writer(buffer, self.parsed, record)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise PayloadError(f"does not fit the Avro schema: {err}") from None
        return buffer.getvalue()


def _parse_avro(text: str, named: dict[str, Any]) -> Any:
    """The schema fastavro parsed, its named types added to `named` (which holds the ones it may name)."""
    try:
        return fastavro.parse_schema(avro_forms.without_time_types(orjson.loads(text)), named_schemas=named)
    except fastavro.schema.UnknownType as err:
        raise SchemaError(f"not an Avro schema: it names the unknown type '{err.name}'") from None
    except (ValueError, TypeError, KeyError) as err:
        raise SchemaError(f"not an Avro schema: {err}") from None


def _parses(text: str, named: dict[str, Any]) -> bool:
    """Parse an imported schema into `named`; False while it names a type not there yet."""
    trial = dict(named)
    try:
        _parse_avro(text, trial)
    except SchemaError:
        return False
    named.update(trial)
    return True


class JsonSchema:
    """A JSON Schema (jsonschema, of the draft its `$schema` names, 2020-12 without one)."""

    def __init__(self, text: str, imports: dict[str, str] | None = None) -> None:
        """Check the schema against its draft's meta-schema; a `$ref` to a name `imports` has (its
        text by name) resolves to that schema."""
        try:
            schema = orjson.loads(text)
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(schema)
            resources = [
                (name, Resource.from_contents(orjson.loads(t), default_specification=DRAFT202012))
                for name, t in (imports or {}).items()
            ]
        except (ValueError, jsonschema.SchemaError) as err:
            raise SchemaError(f"not a JSON Schema: {getattr(err, 'message', err)}") from None
        self.validator = cls(schema, registry=Registry().with_resources(resources))

    def _check(self, record: Any) -> None:
        try:
            error = jsonschema.exceptions.best_match(self.validator.iter_errors(record))
        except Unresolvable as err:  # a $ref to no schema it imports
            raise PayloadError(f"cannot be checked: its JSON Schema has a $ref to nothing ({err})") from None
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the value"
            raise PayloadError(f"does not fit its JSON Schema at {where}: {error.message}")

    def read(self, payload: bytes) -> Any:
        """Parse and validate one value."""
        try:
            record = orjson.loads(payload)
        except ValueError as err:
            raise PayloadError(f"is not JSON ({err})") from None
        self._check(record)
        return record

    def write(self, record: Any) -> bytes:
        """Validate and write one record."""
        self._check(record)
        return orjson.dumps(record)


class ProtobufSchema:
    """The messages of a `.proto` file (compiled by protoc, read by the protobuf runtime)."""

    def __init__(self, text: str, message: str | None = None, imports: dict[str, str] | None = None) -> None:
        """Compile the file, the files it `imports` (their texts by the name it imports them by) beside
        it; a writer writes `message` (a full name), else the file's first message."""
        fds = _compile_proto(text, imports or {})
        pool = descriptor_pool.DescriptorPool()
        for file in fds.file:
            pool.Add(file)
        self.file = pool.FindFileByName(fds.file[-1].name)
        if not self.file.message_types_by_name:
            raise SchemaError("the .proto file defines no message")
        self._top = top = list(self.file.message_types_by_name.values())
        self._classes: dict[tuple[int, ...], type[Message]] = {}
        target = top[0] if message is None else _find(top, message)
        if target is None:
            names = ", ".join(d.full_name for d in top)
            raise SchemaError(f"message '{message}' is not in the .proto file (it has {names})")
        self.message = message_factory.GetMessageClass(target)
        self._path = message_path(_path_of(target))

    def _class(self, path: list[int]) -> type[Message]:
        key = tuple(path)
        found = self._classes.get(key)
        if found is None:
            try:
                descriptor: Descriptor = self._top[path[0]]
                for i in path[1:]:
                    descriptor = descriptor.nested_types[i]
            except IndexError:
                raise PayloadError(
                    f"has the message path {path}, which names no message of its schema"
                ) from None
            found = self._classes[key] = message_factory.GetMessageClass(descriptor)
        return found

    def read(self, payload: bytes) -> Any:
        """Decode the message its path names."""
        try:
            path, data = read_message_path(payload)
            return _record(self._class(path).FromString(data))
        except (DecodeError, ValueError) as err:
            if isinstance(err, PayloadError):
                raise
            raise PayloadError(f"does not decode with its Protobuf schema: {err}") from None

    def write(self, record: Any) -> bytes:
        """The message path and the encoded message."""
        try:
            encoded = json_format.ParseDict(record, self.message()).SerializeToString()
        except (json_format.ParseError, TypeError, AttributeError) as err:
            raise PayloadError(
                f"does not fit the Protobuf message {self.message.DESCRIPTOR.full_name}: {err}"
            ) from None
        return self._path + bytes(encoded)


def _compile_proto(text: str, imports: dict[str, str]) -> descriptor_pb2.FileDescriptorSet:
    """The file's descriptors, compiled by protoc (grpc_tools) with the well-known types and `imports`
    at hand."""
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="nopstream-proto-") as tmp:
        root = Path(tmp).resolve()
        for name, imported in imports.items():
            path = (root / name).resolve()
            if name.startswith("/") or not path.is_relative_to(root) or name == "schema.proto":
                raise SchemaError(f"imports '{name}', which is not a relative path of a .proto file")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(imported)
        (Path(tmp) / "schema.proto").write_text(text)
        out = Path(tmp) / "schema.pb"
        argv = [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{include}",
                f"--descriptor_set_out={out}", "--include_imports", "schema.proto"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["protoc failed"])[0]
            where = first.partition("schema.proto:")[2] or first  # protoc names the file by its path
            raise SchemaError(f"not a .proto file protoc compiles: {where}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _find(top: list[Descriptor], name: str) -> Descriptor | None:
    todo = list(top)
    while todo:
        d = todo.pop()
        if d.full_name == name:
            return d
        todo.extend(d.nested_types)
    return None


def _path_of(descriptor: Descriptor) -> list[int]:
    """The indexes of a message in its file: its top-level message, then nested ones."""
    path = []
    while descriptor.containing_type is not None:
        parent = descriptor.containing_type
        path.append(list(parent.nested_types).index(descriptor))
        descriptor = parent
    path.append(list(descriptor.file.message_types_by_name.values()).index(descriptor))
    return path[::-1]


def _record(message: Message) -> dict[str, Any]:
    """A message as a record: every field (proto3's unset ones at their defaults), messages not set as
    None, enums by name, bytes as base64 text, 64-bit integers as numbers."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _field_value(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_field_value(field, v) for v in value]
        elif field.message_type is not None and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _field_value(field, value)
    return out


def _field_value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _record(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else value
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    return value


def schema_of(kind: str, text: str, imports: dict[str, str], message: str | None = None) -> Schema:
    """The reader and writer of a registry schema of type `kind` (AVRO, JSON, PROTOBUF), the schemas
    it imports at hand; Protobuf writes `message`."""
    if kind == "PROTOBUF":
        return ProtobufSchema(text, message, imports)
    return AvroSchema(text, imports) if kind == "AVRO" else JsonSchema(text, imports)


class RegistryCodec:
    """Framed values: each read with the schema its id names, written with the one `writer` gives."""

    def __init__(self, registry: SchemaRegistryClient, fmt: str) -> None:
        """Values of `fmt` whose schemas `registry` keeps; `start_writing` before the first `encode`."""
        self.registry = registry
        self.format = fmt
        self._schemas: dict[int, Schema] = {}
        self._writer: tuple[int, Schema] | None = None

    def _schema(self, schema_id: int) -> Schema:
        found = self._schemas.get(schema_id)
        if found is None:
            try:
                registered = self.registry.by_id(schema_id)
            except RegistryRefused as err:
                raise PayloadError(
                    f"has schema id {schema_id}, which the registry does not have ({err})"
                ) from None
            if registered.kind != KINDS[self.format]:
                raise PayloadError(
                    f"has schema id {schema_id}, a {registered.kind} schema (rule: format {self.format} reads"
                    f" {KINDS[self.format]} schemas)"
                )
            try:
                imports = self.registry.imports(registered.references)
                found = self._schemas[schema_id] = schema_of(registered.kind, registered.text, imports)
            except RegistryRefused as err:
                raise PayloadError(
                    f"has schema id {schema_id}, whose references the registry does not have ({err})"
                ) from None
            except SchemaError as err:
                raise PayloadError(f"has schema id {schema_id}, whose schema cannot be read: {err}") from None
        return found

    def decode(self, value: bytes) -> Any:
        """The record of a framed value."""
        try:
            schema_id, payload = unframe(value)
        except ValueError as err:
            raise PayloadError(f"is not in the schema registry's wire format: {err}") from None
        return self._schema(schema_id).read(payload)

    def start_writing(self, config: KafkaSinkConfig, who: str) -> None:
        """Register `valueSchema` under the sink's subject (or read the subject's latest schema);
        StartRefused naming `who` when the schema or the registry says no."""
        subject, kind = config.value_subject(), KINDS[self.format]
        try:
            if config.value_schema is not None:
                text = config.value_schema
                references = tuple(config.references)
                imports = self.registry.imports(references)
                # a bad schema never reaches the registry
                schema = schema_of(kind, text, imports, config.message)
                schema_id = self.registry.register(subject, kind, text, references)
            else:
                latest = self.registry.latest(subject)
                if latest.kind != kind:
                    raise SchemaError(
                        f"the latest schema of subject '{subject}' is {latest.kind}, not {kind}"
                    )
                imports = self.registry.imports(latest.references)
                schema, schema_id = schema_of(kind, latest.text, imports, config.message), latest.id
        except SchemaError as err:
            raise StartRefused(f"{who}: valueSchema: {err}") from None
        except RegistryRefused as err:
            registry = f"schema registry at {self.registry.url}"
            raise StartRefused(f"{who}: {registry} refused subject '{subject}': {err}") from None
        self._writer = (schema_id, schema)

    def encode(self, record: Any) -> bytes:
        """A record framed with the writer's schema id."""
        assert self._writer is not None, "start_writing comes first"
        schema_id, schema = self._writer
        return frame(schema_id, schema.write(record))


def value_codec(config: KafkaPayload, who: str, secret_ref: str | None) -> PlainCodec | RegistryCodec:
    """The codec of a connector's values; a registry format's registry is asked once here (StartRefused
    naming `who` when it cannot be used), with the password of the connector's Secret `secret_ref`."""
    if config.format not in REGISTRY_FORMATS:
        return PlainCodec(config.format)
    assert config.schema_registry is not None  # the config's validator
    registry = SchemaRegistryClient(config.schema_registry, secret_ref)
    registry.reach(who)
    return RegistryCodec(registry, config.format)
