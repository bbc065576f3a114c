"""The rules of each operator: its fields, functions, keys, windows, joins, patterns and time."""

from __future__ import annotations

from collections.abc import Iterator

from nopstream.model.errors import Issue
from nopstream.model.spec import (
    KEYED_OPERATORS,
    AsyncSpec,
    KeySpec,
    LookupSpec,
    OperatorSpec,
    SourceSpec,
    WindowSpec,
)
from nopstream.plan.nodes import MAIN_OUTPUT, ResolvedNode, input_keys
from nopstream.plan.validation.rules import (
    FN_PATTERN,
    ID_PATTERN,
    MAX_ASYNC_CAPACITY,
    MAX_DURATION_MS,
    MAX_WINDOWS_PER_RECORD,
    Context,
    at_most,
    describe_key,
    fn_rule_text,
    id_rule_text,
    late_outputs,
    upstream_sources,
)

_FIELDS_BY_TYPE: dict[str, frozenset[str]] = {
    "map": frozenset({"fn"}),
    "filter": frozenset({"fn"}),
    "flat_map": frozenset({"fn"}),
    "async_map": frozenset({"fn", "async_"}),
    "async_flat_map": frozenset({"fn", "async_"}),
    "lookup": frozenset({"lookup", "async_"}),
    "key_by": frozenset({"key"}),
    "reduce": frozenset({"fn", "key", "emit", "combine"}),
    "aggregate": frozenset({"aggregate", "key", "emit", "combine"}),
    "union": frozenset(),
    "window": frozenset({"window", "key", "aggregate", "fn", "combine"}),
    "process": frozenset({"fn", "key", "keys", "broadcast"}),
    "cep": frozenset({"pattern", "key"}),
    "join": frozenset({"join", "key", "keys", "fn"}),
}

_OPTIONAL_FIELDS = (
    "fn",
    "key",
    "keys",
    "broadcast",
    "aggregate",
    "window",
    "pattern",
    "join",
    "emit",
    "combine",
    "async_",
    "lookup",
)

_NEEDS_FN = frozenset({"map", "filter", "flat_map", "async_map", "async_flat_map", "reduce", "process"})


def check_operators(ctx: Context) -> Iterator[Issue]:
    """Every operator by its own rules."""
    for n in ctx.nodes:
        if isinstance(n.spec, OperatorSpec):
            yield from _check_operator(ctx, n, n.spec)


def _check_operator(ctx: Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
    allowed = _FIELDS_BY_TYPE[op.type]
    for field in _OPTIONAL_FIELDS:
        if getattr(op, field) is not None and field not in allowed:
            name = field.rstrip("_")  # `async_` is `async` in the model
            yield Issue(ctx.path(n, name), f"not used by an operator of type {op.type}", "field-applies")
    if op.type in _NEEDS_FN and op.fn is None:
        yield Issue(ctx.path(n, "fn"), f"an operator of type {op.type} needs 'fn'", "fn-required")
    if op.fn is not None and not FN_PATTERN.match(op.fn):
        yield Issue(ctx.path(n, "fn"), fn_rule_text(op.fn), "fn-format")
    if op.key is not None:
        yield from check_key(ctx, n, op.key, ("key",))
    if op.keys is not None:
        yield from _check_keys(ctx, n, op, op.keys)
    if op.broadcast is not None and op.type == "process":
        yield from _check_broadcast(ctx, n, op, op.broadcast)
    if op.type == "key_by" and op.key is None:
        yield Issue(ctx.path(n, "key"), "key_by needs 'key'", "key-required")
    if op.type in KEYED_OPERATORS:
        yield from _check_keyed(ctx, n, op)
    if op.type == "aggregate" and op.aggregate is None:
        yield Issue(ctx.path(n, "aggregate"), "aggregate needs 'aggregate'", "aggregate-required")
    if op.aggregate is not None:
        if (op.aggregate.kind is None) == (op.aggregate.fn is None):
            yield Issue(ctx.path(n, "aggregate"), "needs exactly one of 'kind' or 'fn'", "one-of")
        elif op.aggregate.fn is not None and not FN_PATTERN.match(op.aggregate.fn):
            yield Issue(ctx.path(n, "aggregate", "fn"), fn_rule_text(op.aggregate.fn), "fn-format")
    if op.type == "window":
        yield from _check_window(ctx, n, op)
    if op.type == "cep":
        yield from _check_pattern(ctx, n, op)
    if op.type == "join":
        yield from _check_join(ctx, n, op)
    if op.async_ is not None:
        yield from _check_async(ctx, n, op.async_)
    if op.type == "lookup":
        yield from _check_lookup(ctx, n, op.lookup)
    if op.state_ttl_ms is not None or op.state_ttl_time is not None:
        yield from _check_ttl(ctx, n, op)
    if op.partitioning is not None and op.type in KEYED_OPERATORS | {"union"}:
        yield Issue(
            ctx.path(n, "partitioning"),
            f"an operator of type {op.type} is partitioned by its type, not by 'partitioning'",
            "partitioning-applies",
        )
    if op.state_version < 1:
        yield Issue(ctx.path(n, "stateVersion"), f"must be at least 1, got {op.state_version}", "positive")
    if op.on_error is not None and op.type in ("key_by", "union"):
        yield Issue(
            ctx.path(n, "onError"), f"an operator of type {op.type} runs no function", "field-applies"
        )
    yield from check_dead_letters(ctx, n, op)


def _check_async(ctx: Context, n: ResolvedNode, a: AsyncSpec) -> Iterator[Issue]:
    """Capacity, time-out and retries within bounds; the retry predicate and fallback are references."""
    for field, value, least in (
        ("capacity", a.capacity, 1),
        ("timeoutMs", a.timeout_ms, 1),
        ("retries", a.retries, 0),
        ("backoffMs", a.backoff_ms, 0),
    ):
        if value < least:
            rule = "positive" if least else "non-negative"
            yield Issue(ctx.path(n, "async", field), f"must be at least {least}, got {value}", rule)
    if a.capacity > MAX_ASYNC_CAPACITY:
        yield Issue(
            ctx.path(n, "async", "capacity"),
            f"must be at most {MAX_ASYNC_CAPACITY}, got {a.capacity}",
            "bounds",
        )
    for field, value in (("timeoutMs", a.timeout_ms), ("backoffMs", a.backoff_ms)):
        yield from at_most(ctx.path(n, "async", field), value, MAX_DURATION_MS)
    for field, ref in (("retryOn", a.retry_on), ("onTimeout", a.on_timeout)):
        if ref is not None and not FN_PATTERN.match(ref):
            yield Issue(ctx.path(n, "async", field), fn_rule_text(ref), "fn-format")


def _check_lookup(ctx: Context, n: ResolvedNode, lookup: LookupSpec | None) -> Iterator[Issue]:
    """What a lookup of its kind needs, and only that; a cache of positive size and TTL."""
    if lookup is None:
        yield Issue(ctx.path(n, "lookup"), "a lookup needs 'lookup'", "lookup-required")
        return
    needed = {"http": ("url",), "postgres": ("query", "database", "user")}[lookup.kind]
    for field, value in (
        ("url", lookup.url),
        ("query", lookup.query),
        ("database", lookup.database),
        ("user", lookup.user),
    ):
        if field in needed and not value:
            yield Issue(
                ctx.path(n, "lookup", field), f"a {lookup.kind} lookup needs {field}", "lookup-required"
            )
        elif field not in needed and value is not None:
            yield Issue(ctx.path(n, "lookup", field), f"not used by a {lookup.kind} lookup", "field-applies")
    if not lookup.into:
        yield Issue(ctx.path(n, "lookup", "into"), "names the field the result goes into", "lookup-required")
    if lookup.cache is not None:
        for name, size in (("maxEntries", lookup.cache.max_entries), ("ttlMs", lookup.cache.ttl_ms)):
            if size < 1:
                yield Issue(
                    ctx.path(n, "lookup", "cache", name), f"must be at least 1, got {size}", "positive"
                )
        yield from at_most(ctx.path(n, "lookup", "cache", "ttlMs"), lookup.cache.ttl_ms, MAX_DURATION_MS)


def check_dead_letters(ctx: Context, n: ResolvedNode, spec: OperatorSpec | SourceSpec) -> Iterator[Issue]:
    """`deadLetterOutput` only with `onError: dead-letter`, an id, not another output's name."""
    tag = spec.dead_letter_output
    if tag is None:
        return
    if spec.on_error != "dead-letter":
        yield Issue(ctx.path(n, "deadLetterOutput"), "needs onError: dead-letter", "field-applies")
    elif not ID_PATTERN.match(tag):
        yield Issue(ctx.path(n, "deadLetterOutput"), id_rule_text(tag), "id-format")
    elif tag in late_outputs(spec) or tag == MAIN_OUTPUT:
        yield Issue(ctx.path(n, "deadLetterOutput"), f"'{tag}' names another output", "distinct-outputs")


def check_key(ctx: Context, n: ResolvedNode, key: KeySpec, at: tuple[str | int, ...]) -> Iterator[Issue]:
    """A key names exactly one of a field or a function, well formed."""
    if (key.field is None) == (key.fn is None):
        yield Issue(ctx.path(n, *at), "needs exactly one of 'field' or 'fn'", "one-of")
    elif key.fn is not None and not FN_PATTERN.match(key.fn):
        yield Issue(ctx.path(n, *at, "fn"), fn_rule_text(key.fn), "fn-format")


def _check_keys(ctx: Context, n: ResolvedNode, op: OperatorSpec, keys: list[KeySpec]) -> Iterator[Issue]:
    if op.key is not None:
        yield Issue(
            ctx.path(n, "keys"),
            "set 'key' (one for every input) or 'keys' (one per input), not both",
            "one-of",
        )
    if len(keys) != len(n.inputs):
        yield Issue(
            ctx.path(n, "keys"),
            f"one key per input: {len(n.inputs)} input(s), {len(keys)} key(s)",
            "keys-per-input",
        )
    for i, key in enumerate(keys):
        yield from check_key(ctx, n, key, ("keys", i))


def _check_broadcast(
    ctx: Context, n: ResolvedNode, op: OperatorSpec, broadcast: list[str]
) -> Iterator[Issue]:
    listed = op.inputs or []
    for i, name in enumerate(broadcast):
        if name not in listed:
            yield Issue(
                ctx.path(n, "broadcast", i),
                f"'{name}' is not one of the operator's inputs ({', '.join(listed) or 'none listed'})",
                "broadcast-inputs",
            )
    if listed and set(listed) <= set(broadcast):
        yield Issue(
            ctx.path(n, "broadcast"),
            "every input is broadcast: a process with broadcast inputs needs a keyed one too",
            "broadcast-inputs",
        )
    if op.keys is not None:
        yield Issue(
            ctx.path(n, "keys"),
            "a process with broadcast inputs keys its other inputs with one 'key'",
            "broadcast-key",
        )


def _check_keyed(ctx: Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
    if op.keys is not None:  # each input keyed by its own selector (`_check_keys`)
        return
    keys = input_keys(n, ctx.by_id)
    if op.key is None and not keys:
        yield Issue(
            ctx.path(n, "key"),
            f"keyed operator '{n.node_id}' ({op.type}) needs a key: set 'key'"
            + (
                ", or 'keys' (one per input),"
                if "keys" in _FIELDS_BY_TYPE[op.type] and len(n.inputs) > 1
                else ""
            )
            + " or read from a key_by",
            "key-required",
        )
    distinct = {k for k in ([op.key] if op.key is not None else []) + keys}
    if len(distinct) > 1:
        yield Issue(
            ctx.path(n, "key"),
            f"keyed operator '{n.node_id}' gets conflicting keys: "
            + ", ".join(sorted(describe_key(k) for k in distinct)),
            "one-key",
        )


def _check_window(ctx: Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
    w = op.window
    if w is None:
        yield Issue(ctx.path(n, "window"), "a window operator needs 'window'", "window-required")
        return
    if w.time is None:
        yield Issue(
            ctx.path(n, "window", "time"),
            "a window needs a time characteristic: 'event' or 'processing'",
            "window-time",
        )
    yield from _check_window_shape(ctx, n, w, ("window",))
    if w.allowed_lateness_ms < 0:
        yield Issue(ctx.path(n, "window", "allowedLatenessMs"), "must not be negative", "non-negative")
    else:
        yield from at_most(ctx.path(n, "window", "allowedLatenessMs"), w.allowed_lateness_ms, MAX_DURATION_MS)
    if w.late_output is not None and not ID_PATTERN.match(w.late_output):
        yield Issue(ctx.path(n, "window", "lateOutput"), id_rule_text(w.late_output), "id-format")
    if (op.aggregate is None) == (op.fn is None):
        yield Issue(
            ctx.path(n),
            "a window needs exactly one of 'aggregate' or 'fn' (a function over the window's records)",
            "one-of",
        )
    if w.time == "event":
        yield from _check_event_time(ctx, n, ("window", "time"))


def _check_ttl(ctx: Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
    temporal = op.type == "join" and op.join is not None and op.join.kind == "temporal"
    if op.type != "process" and not temporal:
        field = "stateTtlMs" if op.state_ttl_ms is not None else "stateTtlTime"
        yield Issue(
            ctx.path(n, field),
            "state TTL applies to a process and a temporal join (a window's, a CEP pattern's and an"
            " interval or window join's state is dropped as event time passes it)",
            "field-applies",
        )
        return
    if op.state_ttl_ms is None:
        yield Issue(ctx.path(n, "stateTtlMs"), "stateTtlTime needs stateTtlMs", "ttl-required")
    elif op.state_ttl_ms < 1:
        yield Issue(ctx.path(n, "stateTtlMs"), f"must be at least 1, got {op.state_ttl_ms}", "positive")
    else:
        yield from at_most(ctx.path(n, "stateTtlMs"), op.state_ttl_ms, MAX_DURATION_MS)
    if temporal and op.state_ttl_time == "processing":
        yield Issue(
            ctx.path(n, "stateTtlTime"),
            "a temporal join's versions expire in event time only (a version valid for stateTtlMs"
            " after its timestamp)",
            "join-time",
        )
    elif op.state_ttl_time in (None, "event"):
        yield from _check_event_time(ctx, n, ("stateTtlMs",))


def _check_window_shape(ctx: Context, n: ResolvedNode, w: WindowSpec, at: tuple[str, ...]) -> Iterator[Issue]:
    """The sizes a window's kind needs, and only those, within bounds."""
    needed = {"tumbling": ("sizeMs",), "sliding": ("sizeMs", "slideMs"), "session": ("gapMs",)}[w.kind]
    values = {"sizeMs": w.size_ms, "slideMs": w.slide_ms, "gapMs": w.gap_ms}
    for field, value in values.items():
        if field in needed and (value is None or value < 1):
            yield Issue(
                ctx.path(n, *at, field),
                f"a {w.kind} window needs {field} of at least 1",
                "window-size",
            )
        elif field not in needed and value is not None:
            yield Issue(ctx.path(n, *at, field), f"not used by a {w.kind} window", "field-applies")
        elif value is not None:
            yield from at_most(ctx.path(n, *at, field), value, MAX_DURATION_MS)
    if w.kind == "sliding" and w.size_ms and w.slide_ms and 0 < w.slide_ms < w.size_ms <= MAX_DURATION_MS:
        per_record = -(-w.size_ms // w.slide_ms)
        if per_record > MAX_WINDOWS_PER_RECORD:
            yield Issue(
                ctx.path(n, *at, "slideMs"),
                f"puts each record in {per_record} windows (sizeMs / slideMs), at most"
                f" {MAX_WINDOWS_PER_RECORD}",
                "bounds",
            )


_JOIN_HOWS = {
    "interval": ("inner", "left", "right", "full", "semi", "anti"),
    "window": ("inner", "left", "right", "full", "semi", "anti"),
    "temporal": ("inner", "left"),
}


def _check_join(ctx: Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
    j = op.join
    if j is None:
        yield Issue(ctx.path(n, "join"), "a join operator needs 'join'", "join-required")
        return
    if len(n.inputs) != 2:
        yield Issue(
            ctx.path(n, "inputs"),
            f"a join has two inputs, left then right: got {len(n.inputs)}",
            "join-inputs",
        )
    if j.time != "event":
        yield Issue(
            ctx.path(n, "join", "time"),
            "a join matches records by their event timestamps: only 'event' time (a processing-time"
            " join would pair whatever arrived together, different in every run)",
            "join-time",
        )
    else:
        yield from _check_event_time(ctx, n, ("join", "kind"))
    if j.how not in _JOIN_HOWS[j.kind]:
        yield Issue(
            ctx.path(n, "join", "how"),
            f"a {j.kind} join is one of {', '.join(_JOIN_HOWS[j.kind])}, got '{j.how}'",
            "join-how",
        )
    if j.late_output is not None and not ID_PATTERN.match(j.late_output):
        yield Issue(ctx.path(n, "join", "lateOutput"), id_rule_text(j.late_output), "id-format")
    for field, value in (("lowerMs", j.lower_ms), ("upperMs", j.upper_ms)):
        if j.kind == "interval" and value is None:
            yield Issue(
                ctx.path(n, "join", field),
                f"an interval join needs {field}: right.ts - left.ts must lie in [lowerMs, upperMs]",
                "join-bounds",
            )
        elif j.kind != "interval" and value is not None:
            yield Issue(ctx.path(n, "join", field), f"not used by a {j.kind} join", "field-applies")
        elif value is not None and abs(value) > MAX_DURATION_MS:
            yield Issue(
                ctx.path(n, "join", field),
                f"must be within ±{MAX_DURATION_MS:,}, got {value:,}",
                "bounds",
            )
    if j.lower_ms is not None and j.upper_ms is not None and j.lower_ms > j.upper_ms:
        yield Issue(
            ctx.path(n, "join", "lowerMs"),
            f"lowerMs {j.lower_ms} is above upperMs {j.upper_ms}: no pair could match",
            "join-bounds",
        )
    if j.kind == "window":
        yield from _check_join_window(ctx, n, j.window)
    elif j.window is not None:
        yield Issue(ctx.path(n, "join", "window"), f"not used by a {j.kind} join", "field-applies")


def _check_join_window(ctx: Context, n: ResolvedNode, w: WindowSpec | None) -> Iterator[Issue]:
    if w is None:
        yield Issue(ctx.path(n, "join", "window"), "a window join needs 'window'", "window-required")
        return
    yield from _check_window_shape(ctx, n, w, ("join", "window"))
    if w.time not in (None, "event"):
        yield Issue(
            ctx.path(n, "join", "window", "time"), "a window join runs in event time only", "join-time"
        )
    if w.allowed_lateness_ms:
        yield Issue(
            ctx.path(n, "join", "window", "allowedLatenessMs"),
            "not used by a window join: a window joins once, when the watermark passes its end",
            "field-applies",
        )
    if w.late_output is not None:
        yield Issue(
            ctx.path(n, "join", "window", "lateOutput"),
            "a join's late records go to join.lateOutput",
            "field-applies",
        )


def _check_pattern(ctx: Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
    p = op.pattern
    if p is None:
        yield Issue(ctx.path(n, "pattern"), "a cep operator needs 'pattern'", "pattern-required")
        return
    if not p.steps:
        yield Issue(ctx.path(n, "pattern", "steps"), "a pattern needs at least one step", "pattern-steps")
    names: set[str] = set()
    for i, step in enumerate(p.steps):
        if step.name in names:
            yield Issue(
                ctx.path(n, "pattern", "steps", i, "name"),
                f"duplicate step '{step.name}'",
                "unique-ids",
            )
        names.add(step.name)
        if not FN_PATTERN.match(step.where):
            yield Issue(ctx.path(n, "pattern", "steps", i, "where"), fn_rule_text(step.where), "fn-format")
    if p.within_ms is None or p.within_ms < 1:
        yield Issue(ctx.path(n, "pattern", "withinMs"), "a pattern needs withinMs of at least 1", "within")
    else:
        yield from at_most(ctx.path(n, "pattern", "withinMs"), p.within_ms, MAX_DURATION_MS)
    if p.time is None:
        yield Issue(
            ctx.path(n, "pattern", "time"),
            "a pattern needs a time characteristic: 'event' or 'processing'",
            "window-time",
        )
    elif p.time == "event":
        yield from _check_event_time(ctx, n, ("pattern", "time"))


def _check_event_time(ctx: Context, n: ResolvedNode, at: tuple[str, ...]) -> Iterator[Issue]:
    for src in upstream_sources(ctx, n):
        if isinstance(src.spec, SourceSpec) and src.spec.watermark is None:
            yield Issue(
                ctx.path(n, *at),
                f"event time needs a watermark strategy on source '{src.node_id}'",
                "event-time-watermarks",
            )
