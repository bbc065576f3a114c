"""The Python builder API: the same StreamModel as YAML, written as chained calls.

    job = JobBuilder("wordcount", parallelism=2)
    words = job.source("lines", "file", config={"path": "in/*.txt"}).flat_map("wordcount:split", id="split")
    counts = words.key_by(fn="wordcount:word", id="by-word").aggregate("count", id="count")
    counts.sink("out", "file", config={"path": "out"}, parallelism=1)
    model = job.build()

Every operator records its inputs explicitly, so the built model compiles to the
same plan (and fingerprint) as the equivalent YAML. A user function is given by its
`module:attribute` name or as the function (or class) itself, which is recorded by its
importable name; one that task processes could not import by name (a lambda, a function
defined inside another or in the script being run) is refused with what to do instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nopstream.model.functions import NotImportable, arity_issue, reference
from nopstream.model.spec import (
    AggregateSpec,
    AsyncSpec,
    GraphSpec,
    JoinSpec,
    KeySpec,
    LookupSpec,
    OperatorSpec,
    PatternSpec,
    PatternStep,
    SinkSpec,
    SourceSpec,
    StreamModel,
    WatermarkSpec,
    WindowSpec,
)


class JobBuilder:
    """Collects sources, operators and sinks; `build()` returns the StreamModel."""

    def __init__(self, job_id: str, **settings: Any) -> None:
        """Start a job; `settings` are StreamModel fields (snake_case), e.g. parallelism=2."""
        self._job_id = job_id
        self._settings = settings
        self._sources: list[SourceSpec] = []
        self._operators: list[OperatorSpec] = []
        self._sinks: list[SinkSpec] = []

    def source(
        self,
        id: str,
        type: str,
        *,
        config: dict[str, Any] | None = None,
        parallelism: int | None = None,
        watermark: WatermarkSpec | None = None,
    ) -> Stream:
        """Add a source and return its stream."""
        self._sources.append(
            SourceSpec(id=id, type=type, config=config or {}, parallelism=parallelism, watermark=watermark)
        )
        return Stream(self, id)

    def build(self) -> StreamModel:
        """The StreamModel of everything added so far."""
        graph = GraphSpec(sources=self._sources, operators=self._operators, sinks=self._sinks)
        return StreamModel.model_validate({"job_id": self._job_id, **self._settings, "graph": graph})

    def _add(self, op: OperatorSpec) -> Stream:
        self._operators.append(op)
        return Stream(self, op.id or f"operators-{len(self._operators) - 1}")


Fn = str | Callable[..., Any]
"""A user function: its `module:attribute` name, or the function or class itself."""


def _function(fn: Fn, kind: str, op_id: str | None) -> Any:
    """A function given by name as it is; one given itself by its name, or a one-line error naming the
    operator (NotImportable, or WrongArity when it cannot take what a `kind` function is called with)."""
    if isinstance(fn, str):
        return fn
    where = f"operator '{op_id}' ({kind})" if op_id else f"a {kind} operator"
    problem = arity_issue(fn, kind)
    if problem is not None:
        raise WrongArity(f"{where}: {problem}: give it exactly those parameters")
    try:
        return reference(fn)
    except NotImportable as err:
        raise NotImportable(f"{where}: {err}") from None


class WrongArity(ValueError):
    """A function given to the builder that cannot take the arguments its operator calls it with."""


@dataclass(frozen=True)
class Stream:
    """The output of one node (or one of its side outputs), to chain operators on."""

    job: JobBuilder
    ref: str

    def _op(self, type: str, inputs: list[str] | None = None, **fields: Any) -> Stream:
        if fields.get("fn") is not None:  # a function given itself: its name, or one clear error
            fields["fn"] = _function(fields["fn"], type, fields.get("id"))
        return self.job._add(
            OperatorSpec.model_validate({"type": type, "inputs": inputs or [self.ref], **fields})
        )

    def map(self, fn: Fn, *, id: str | None = None, parallelism: int | None = None) -> Stream:
        """One record out for each record in."""
        return self._op("map", fn=fn, id=id, parallelism=parallelism)

    def filter(self, fn: Fn, *, id: str | None = None, parallelism: int | None = None) -> Stream:
        """Keep the records for which `fn` is true."""
        return self._op("filter", fn=fn, id=id, parallelism=parallelism)

    def flat_map(self, fn: Fn, *, id: str | None = None, parallelism: int | None = None) -> Stream:
        """Zero or more records out for each record in."""
        return self._op("flat_map", fn=fn, id=id, parallelism=parallelism)

    def async_map(
        self,
        fn: Fn,
        *,
        settings: AsyncSpec | None = None,
        flat: bool = False,
        id: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """`await fn(record)` for each record, many at once (`async_flat_map` with `flat`)."""
        kind = "async_flat_map" if flat else "async_map"
        fields: dict[str, Any] = {"async": settings}  # a keyword of Python's: passed by name
        return self._op(kind, fn=fn, id=id, parallelism=parallelism, **fields)

    def lookup(
        self,
        lookup: LookupSpec,
        *,
        settings: AsyncSpec | None = None,
        id: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Each record's result from an HTTP service or a PostgreSQL query, into its field `lookup.into`."""
        fields: dict[str, Any] = {"async": settings}
        return self._op("lookup", lookup=lookup, id=id, parallelism=parallelism, **fields)

    def key_by(self, *, field: str | None = None, fn: Fn | None = None, id: str | None = None) -> Stream:
        """Partition by a key; the next keyed operator keeps its state per key."""
        key_fn = _function(fn, "key", id) if fn is not None else None
        return self._op("key_by", key=KeySpec(field=field, fn=key_fn), id=id)

    def reduce(
        self,
        fn: Fn,
        *,
        id: str,
        key: KeySpec | None = None,
        parallelism: int | None = None,
        emit: str | None = None,
    ) -> Stream:
        """Fold each key's records with `fn(accumulator, record)`; emit rolling or final values."""
        return self._op("reduce", fn=fn, id=id, key=key, parallelism=parallelism, emit=emit)

    def aggregate(
        self,
        aggregate: str | AggregateSpec,
        *,
        id: str,
        key: KeySpec | None = None,
        parallelism: int | None = None,
        emit: str | None = None,
    ) -> Stream:
        """An aggregate per key (count/sum/min/max/avg or a function); rolling or final values."""
        return self._op("aggregate", aggregate=aggregate, id=id, key=key, parallelism=parallelism, emit=emit)

    def union(self, *others: Stream, id: str | None = None, parallelism: int | None = None) -> Stream:
        """Merge this stream with others."""
        return self._op("union", inputs=[self.ref, *(o.ref for o in others)], id=id, parallelism=parallelism)

    def window(
        self,
        window: WindowSpec,
        *,
        id: str,
        aggregate: str | AggregateSpec | None = None,
        fn: Fn | None = None,
        key: KeySpec | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Group each key's records into windows and emit one result per window."""
        return self._op(
            "window", window=window, aggregate=aggregate, fn=fn, id=id, key=key, parallelism=parallelism
        )

    def process(
        self,
        fn: Fn,
        *,
        id: str,
        key: KeySpec | None = None,
        parallelism: int | None = None,
        broadcast: tuple[Stream, ...] = (),
    ) -> Stream:
        """A keyed process function with state and timers (`fn` names its class); `broadcast` streams
        reach every subtask and write its broadcast state."""
        if not broadcast:
            return self._op("process", fn=fn, id=id, key=key, parallelism=parallelism)
        refs = [b.ref for b in broadcast]
        return self._op(
            "process",
            inputs=[self.ref, *refs],
            broadcast=refs,
            fn=fn,
            id=id,
            key=key,
            parallelism=parallelism,
        )

    def cep(
        self,
        steps: list[PatternStep],
        *,
        id: str,
        within_ms: int,
        time: str,
        key: KeySpec | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Match a pattern sequence per key within a time bound."""
        pattern = PatternSpec(steps=steps, within_ms=within_ms, time=time)
        return self._op("cep", pattern=pattern, id=id, key=key, parallelism=parallelism)

    def join(
        self,
        right: Stream,
        join: JoinSpec,
        *,
        id: str,
        key: KeySpec | None = None,
        keys: tuple[KeySpec, KeySpec] | None = None,
        fn: Fn | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Join this stream (left) with `right` on their keys (`key` for both, or `keys`, left then right)."""
        return self._op(
            "join",
            inputs=[self.ref, right.ref],
            join=join,
            id=id,
            key=key,
            keys=list(keys) if keys is not None else None,
            fn=fn,
            parallelism=parallelism,
        )

    def side_output(self, name: str) -> Stream:
        """A named side output of this node (a window's or a join's late records, a node's dead letters)."""
        return Stream(self.job, f"{self.ref}:{name}")

    def sink(
        self,
        id: str,
        type: str,
        *,
        config: dict[str, Any] | None = None,
        parallelism: int | None = None,
    ) -> None:
        """Write this stream to a sink."""
        self.job._sinks.append(
            SinkSpec(id=id, type=type, inputs=[self.ref], config=config or {}, parallelism=parallelism)
        )
