"""The StreamModel: what a user asks for, in a StreamJob's spec or a bare file.

These pydantic models check shape and types only (camelCase keys, no unknown keys,
values of the right type). The rules that relate fields to each other, with their
field paths, are `nopstream.plan.validation`'s. Instances are frozen; the canonical
form of a model is `canonical_model(model)`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from nopstream.model.capabilities import SemanticMode
from nopstream.model.connectors import S3_BUCKET, SECRET_NAME, PostgresTls
from nopstream.model.functions import reference

FunctionRef = Annotated[str, BeforeValidator(reference)]
"""A user function: `module:attribute`, or (from the builder) the function or class itself, recorded
by its importable name (`model.functions.reference`)."""

DEFAULT_IMAGE = "nopstream/runtime:0.1.0"
DEFAULT_PIPELINE_ID = "main"
DEFAULT_STATE_SHARD_COUNT = 128
DEFAULT_CHECKPOINT_DIR = ".nopstream/checkpoints"

OperatorType = Literal[
    "map",
    "filter",
    "flat_map",
    "async_map",
    "async_flat_map",
    "lookup",
    "key_by",
    "reduce",
    "aggregate",
    "union",
    "window",
    "process",
    "cep",
    "join",
]
BuiltinAggregate = Literal["count", "sum", "min", "max", "avg"]
TimeCharacteristic = Literal["event", "processing"]
Partitioning = Literal["forward", "rebalance", "broadcast"]
OnError = Literal["fail", "dead-letter"]

BUILTIN_AGGREGATES: tuple[str, ...] = ("count", "sum", "min", "max", "avg")
KEYED_OPERATORS = frozenset({"reduce", "aggregate", "window", "process", "cep", "join"})
"""Operators that keep keyed state: they need a key, their own or a key_by's."""


class Spec(BaseModel):
    """Base of every model part: camelCase keys, unknown keys refused, frozen."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class KeySpec(Spec):
    """A key selector: a record field, or a user function `module:attribute`."""

    field: str | None = None
    fn: FunctionRef | None = None


class AggregateSpec(Spec):
    """A built-in aggregate over an optional field, or a user aggregate function."""

    kind: BuiltinAggregate | None = None
    field: str | None = None
    fn: FunctionRef | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """Accept `aggregate: count` for `{kind: count}` and `aggregate: m:f` for `{fn: m:f}`."""
        if isinstance(data, str):
            return {"kind": data} if data in BUILTIN_AGGREGATES else {"fn": data}
        return data


_AGGREGATE_SCHEMA: dict[str, Any] = {
    "description": "A built-in aggregate (count, sum, min, max, avg) or a function"
    " 'module:attribute'; either a string or {kind, field} / {fn}.",
    "x-kubernetes-preserve-unknown-fields": True,
}


class WindowSpec(Spec):
    """A window assigner: tumbling, sliding or session, in event or processing time."""

    kind: Literal["tumbling", "sliding", "session"]
    time: TimeCharacteristic | None = None
    size_ms: StrictInt | None = None
    slide_ms: StrictInt | None = None
    gap_ms: StrictInt | None = None
    allowed_lateness_ms: StrictInt = 0
    late_output: str | None = None


class PatternStep(Spec):
    """One step of a CEP pattern: a named condition and how it follows the previous."""

    name: str
    where: FunctionRef
    contiguity: Literal["strict", "relaxed"] = "relaxed"
    quantifier: Literal["one", "oneOrMore"] = "one"


class PatternSpec(Spec):
    """A CEP pattern sequence that must complete within a time bound."""

    steps: list[PatternStep]
    within_ms: StrictInt | None = None
    time: TimeCharacteristic | None = None


JoinKind = Literal["interval", "window", "temporal"]
JoinHow = Literal["inner", "left", "right", "full", "semi", "anti"]


class AsyncSpec(Spec):
    """How an async operator calls its coroutine: concurrency, time limit and retries (docs/enrichment.md)."""

    capacity: StrictInt = 10
    """Records in flight at once per subtask; the operator takes no more until one completes."""
    timeout_ms: StrictInt = 10_000
    """How long one attempt may take."""
    retries: StrictInt = 0
    """Attempts after the first, for a failure `retryOn` accepts (every failure without it)."""
    backoff_ms: StrictInt = 100
    """The wait before the first retry, doubled before each next one."""
    retry_on: FunctionRef | None = None
    """`module:attr` of `predicate(exception) -> bool`: whether a failure is worth another attempt."""
    on_timeout: FunctionRef | None = None
    """`module:attr` of `fallback(record)`: the result of a record whose every attempt timed out
    (without it, the time-out is the record's error: `onError`)."""
    ordered: StrictBool = True
    """Results in input order; false: as they complete (never across a watermark or barrier)."""


class LookupCacheSpec(Spec):
    """The results a lookup keeps per subtask: the most recently used, each for a while."""

    max_entries: StrictInt = 10_000
    ttl_ms: StrictInt = 60_000


class LookupSpec(Spec):
    """A built-in lookup (`type: lookup`): each record's result from an HTTP service or a PostgreSQL
    query goes into the record's field `into` (docs/enrichment.md)."""

    kind: Literal["http", "postgres"]
    into: str
    url: str | None = None
    """http: the URL, `{field}` replaced by the record's field (URL-quoted); GET, the JSON body is
    the result (a 404 gives null)."""
    query: str | None = None
    """postgres: a query with `%(field)s` parameters from the record; its first row (columns by name)
    is the result (none: null)."""
    host: str = "127.0.0.1"
    port: StrictInt = Field(5432, ge=1, le=65535)
    database: str | None = None
    user: str | None = None
    secret_ref: str | None = Field(None, pattern=SECRET_NAME)
    """postgres: the password is this Secret's `password` (mounted on a cluster), else
    NOPSTREAM_POSTGRES_PASSWORD, as the PostgreSQL sink's."""
    tls: PostgresTls | None = None
    """postgres: TLS to the server, as the PostgreSQL sink's."""
    cache: LookupCacheSpec | None = None


class JoinSpec(Spec):
    """A join of an operator's two inputs, left and right, on their keys, in event time (docs/joins.md)."""

    kind: JoinKind
    how: JoinHow = "inner"
    time: TimeCharacteristic = "event"
    lower_ms: StrictInt | None = None
    upper_ms: StrictInt | None = None
    window: WindowSpec | None = None
    late_output: str | None = None


class WatermarkSpec(Spec):
    """Event time at a source: where the timestamp is and how late records may be."""

    timestamp_field: str | None = None
    timestamp_fn: FunctionRef | None = None
    max_out_of_orderness_ms: StrictInt = 0
    idle_timeout_ms: StrictInt | None = None


class SourceSpec(Spec):
    """A source node: a connector type, its config, and optional event time."""

    id: str | None = None
    type: str
    parallelism: StrictInt | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    watermark: WatermarkSpec | None = None
    on_error: OnError | None = None
    """A record that cannot be read (not UTF-8, not JSON) or timestamped: `fail` (the default) fails
    the run naming it; `dead-letter` sets it aside on the side output `deadLetterOutput`."""
    dead_letter_output: str | None = None
    """The side output of records set aside (`dead-letter` unless named)."""


class OperatorSpec(Spec):
    """An operator node; which of the optional fields apply depends on `type`."""

    id: str | None = None
    type: OperatorType
    inputs: list[str] | None = None
    parallelism: StrictInt | None = None
    fn: FunctionRef | None = None
    key: KeySpec | None = None
    keys: list[KeySpec] | None = None
    """One key selector per input, in `inputs` order, into one key space (a process of several inputs)."""
    broadcast: list[str] | None = None
    """Inputs of a process (as `inputs` names them) whose records reach every subtask and write its
    broadcast state; the others are keyed and only read it (docs/runtime.md)."""
    aggregate: Annotated[AggregateSpec | None, WithJsonSchema(_AGGREGATE_SCHEMA)] = None
    window: WindowSpec | None = None
    pattern: PatternSpec | None = None
    join: JoinSpec | None = None
    async_: AsyncSpec | None = Field(default=None, alias="async")
    lookup: LookupSpec | None = None
    state_ttl_ms: StrictInt | None = None
    """A key's state expires this long after the last record of the key (a process), or a version of
    a temporal join's table this long after its timestamp (docs/runtime.md, state TTL)."""
    state_ttl_time: TimeCharacteristic | None = None
    """The time `stateTtlMs` counts in: event (the default) or processing (a process only)."""
    partitioning: Partitioning | None = None
    emit: Literal["rolling", "final"] | None = None
    combine: StrictBool | None = None
    on_error: OnError | None = None
    """A record the operator's function or key selector fails on: `fail` (the default) fails the run
    naming the operator, the error and the user's line; `dead-letter` sets it aside on the side output
    `deadLetterOutput` and goes on (docs/runtime.md, errors)."""
    dead_letter_output: str | None = None
    """The side output of records set aside (`dead-letter` unless named)."""
    state_version: StrictInt = 1


class SinkSpec(Spec):
    """A sink node: a connector type and its config; with `key`, one key's rows reach one subtask in order."""

    id: str | None = None
    type: str
    inputs: list[str] | None = None
    parallelism: StrictInt | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    partitioning: Partitioning | None = None
    key: KeySpec | None = None


class GraphSpec(Spec):
    """The dataflow: sources, operators and sinks, joined by their `inputs`."""

    sources: list[SourceSpec]
    operators: list[OperatorSpec] = Field(default_factory=list)
    sinks: list[SinkSpec]


class LocalStorageSpec(Spec):
    """Checkpoints in a local directory (relative paths from the working directory)."""

    path: str


class S3StorageSpec(Spec):
    """Checkpoints in an S3 bucket; credentials come from a Secret."""

    bucket: str = Field(pattern=S3_BUCKET)
    endpoint: str | None = None
    prefix: str = ""
    secret_ref: str | None = None


class StorageSpec(Spec):
    """Where checkpoints live: exactly one of `local` or `s3`."""

    local: LocalStorageSpec | None = None
    s3: S3StorageSpec | None = None


def _default_storage() -> StorageSpec:
    return StorageSpec(local=LocalStorageSpec(path=DEFAULT_CHECKPOINT_DIR))


class CheckpointSpec(Spec):
    """How often epochs are taken, how long they may take, how many are kept."""

    interval_ms: StrictInt = 1000
    timeout_ms: StrictInt = 60_000
    retain_latest: StrictInt = 3
    storage: StorageSpec = Field(default_factory=_default_storage)


class ResourcesSpec(Spec):
    """Kubernetes resource requests and limits of each task pod."""

    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)


class StreamModel(Spec):
    """A whole job: identity, guarantees, checkpointing, deployment and the graph."""

    job_id: str | None = None
    pipeline_id: str = DEFAULT_PIPELINE_ID
    checkpoint_namespace: str | None = None
    plan_version: StrictInt = 1
    semantic_mode: SemanticMode = SemanticMode.STRICT_EXACTLY_ONCE
    state_shard_count: StrictInt = DEFAULT_STATE_SHARD_COUNT
    parallelism: StrictInt = 1
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    image: str = DEFAULT_IMAGE
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    drop_state: list[str] = Field(default_factory=list)
    # Operational settings and requests to the operator; they change no plan.
    suspend: bool = False
    savepoint_nonce: str | None = None
    restart_nonce: str | None = None
    max_recoveries: StrictInt = Field(default=10, ge=0)
    # On Kubernetes, a started pod per task waits for the next run, so that a recovery
    # need not wait for pods to start (twice the task pods while the job runs).
    standby_tasks: bool = False
    graph: GraphSpec = Field(alias="model")


SecretPath = tuple[str | int, ...]


def secret_refs(model: StreamModel) -> list[tuple[SecretPath, str]]:
    """Every Secret the job names by `secretRef`, with its path in the spec: the S3 storage's, then
    the sources', sinks' and lookups' (`model`, section, index, ...), in that order."""
    refs: list[tuple[SecretPath, str | None]] = []
    if model.checkpoint.storage.s3 is not None:
        refs.append((("checkpoint", "storage", "s3", "secretRef"), model.checkpoint.storage.s3.secret_ref))
    connectors: list[tuple[str, int, SourceSpec | SinkSpec]] = [
        *(("sources", i, node) for i, node in enumerate(model.graph.sources)),
        *(("sinks", i, node) for i, node in enumerate(model.graph.sinks)),
    ]
    for section, i, node in connectors:
        refs.append((("model", section, i, "config", "secretRef"), node.config.get("secretRef")))
    for i, op in enumerate(model.graph.operators):
        if op.lookup is not None:
            refs.append((("model", "operators", i, "lookup", "secretRef"), op.lookup.secret_ref))
    return [(at, name) for at, name in refs if isinstance(name, str)]


def canonical_model(model: StreamModel) -> dict[str, Any]:
    """The canonical plain-data form: camelCase keys, defaults filled, unset fields left out."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
