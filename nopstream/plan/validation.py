"""Validation of a StreamModel: every rule of docs/validation.md, all issues at once.

`validate(loaded)` returns every `Issue` found, sorted by field path; an empty list
means the model compiles. Each issue names the field path, what is wrong and the
rule, so the CLI, the operator and a webhook can all show the same message.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

from pydantic import ValidationError

from nopstream.model.capabilities import ALLOWED
from nopstream.model.connectors import SINK_TYPES, SOURCE_TYPES, ConnectorConfig, SinkType, SourceType
from nopstream.model.errors import Issue
from nopstream.model.load import LoadedModel, pydantic_issues
from nopstream.model.spec import (
    KEYED_OPERATORS,
    AsyncSpec,
    KeySpec,
    LookupSpec,
    OperatorSpec,
    SinkSpec,
    SourceSpec,
    WindowSpec,
)
from nopstream.plan.nodes import DEAD_LETTER, MAIN_OUTPUT, ResolvedNode, input_keys, resolve_nodes

ID_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
RESERVED_ID = "coordinator"
"""No node may take it: a task of vertex `coordinator` would share the coordinators' pod names."""
FN_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
NAMESPACE_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$")

K8S_NAME_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
"""A Kubernetes namespace name (an RFC 1123 DNS label)."""
QUANTITY_PATTERN = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
"""A Kubernetes resource quantity as tasks use them (`500m`, `2`, `512Mi`, `1.5Gi`)."""
IMAGE_PATTERN = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(@sha256:[a-f0-9]{64})?$"
)
"""An image reference: [registry[:port]/]path[:tag][@sha256:digest]."""
RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})

# Bounds (docs/validation.md): the largest job they allow validates and compiles in
# well under a second (`bench/compile.py`), and its plan and state fit in memory.
MAX_PARALLELISM = 256
MAX_STATE_SHARDS = 4096
MAX_NODES = 256
MAX_TASKS = 4096
MAX_CHANNELS = 100_000
MAX_RETAIN = 1000
MAX_NAMESPACE = 200
MAX_DURATION_MS = 10 * 365 * 86_400_000
"""Ten years: every duration of a model (window sizes, gaps, lateness, out-of-orderness, ...)."""
MAX_CHECKPOINT_MS = 86_400_000
"""A day: checkpoint.intervalMs and timeoutMs."""
MAX_WINDOWS_PER_RECORD = 1000
MAX_ASYNC_CAPACITY = 10_000
"""sizeMs / slideMs of a sliding window: each record is in that many windows."""

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


@dataclass
class _Context:
    loaded: LoadedModel
    nodes: tuple[ResolvedNode, ...]

    @cached_property
    def by_id(self) -> dict[str, ResolvedNode]:
        by_id: dict[str, ResolvedNode] = {}
        for n in self.nodes:
            by_id.setdefault(n.node_id, n)
        return by_id

    @cached_property
    def consumers(self) -> dict[str, list[ResolvedNode]]:
        out: dict[str, list[ResolvedNode]] = {}
        for n in self.nodes:
            for ref in n.inputs:
                out.setdefault(ref.node_id, []).append(n)
        return out

    def path(self, node: ResolvedNode | None, *parts: str | int) -> str:
        if node is None:
            return self.loaded.path(*parts)
        return self.loaded.path("model", node.section, node.index, *parts)


Check = Callable[[_Context], Iterator[Issue]]


def validate(loaded: LoadedModel) -> list[Issue]:
    """Every rule violation in the model, sorted by path; empty when it compiles."""
    ctx = _Context(loaded, resolve_nodes(loaded.model))
    issues: set[Issue] = set()
    for check in _CHECKS:
        issues.update(check(ctx))
    return sorted(issues)


def _check_job(ctx: _Context) -> Iterator[Issue]:
    m = ctx.loaded.model
    if m.job_id is not None and not ID_PATTERN.match(m.job_id):
        yield Issue(ctx.path(None, "jobId"), _id_rule_text(m.job_id), "id-format")
    if not ID_PATTERN.match(m.pipeline_id):
        yield Issue(ctx.path(None, "pipelineId"), _id_rule_text(m.pipeline_id), "id-format")
    for field, value in (
        ("stateShardCount", m.state_shard_count),
        ("parallelism", m.parallelism),
        ("planVersion", m.plan_version),
    ):
        if value < 1:
            yield Issue(ctx.path(None, field), f"must be at least 1, got {value}", "positive")
    for field, value, bound in (
        ("stateShardCount", m.state_shard_count, MAX_STATE_SHARDS),
        ("parallelism", m.parallelism, MAX_PARALLELISM),
    ):
        if value > bound:
            yield Issue(ctx.path(None, field), f"must be at most {bound}, got {value}", "bounds")
    if m.checkpoint_namespace is not None and not (
        len(m.checkpoint_namespace) <= MAX_NAMESPACE and NAMESPACE_PATTERN.match(m.checkpoint_namespace)
    ):
        yield Issue(
            ctx.path(None, "checkpointNamespace"),
            f"'{m.checkpoint_namespace}' is not a relative path of lower-case letters, digits, '.', '_'"
            f" and '-' segments joined by '/' (each starting and ending with a letter or digit,"
            f" at most {MAX_NAMESPACE} characters)",
            "namespace-format",
        )
    cp = m.checkpoint
    for field, value in (
        ("intervalMs", cp.interval_ms),
        ("timeoutMs", cp.timeout_ms),
        ("retainLatest", cp.retain_latest),
    ):
        if value < 1:
            yield Issue(ctx.path(None, "checkpoint", field), f"must be at least 1, got {value}", "positive")
        elif field != "retainLatest":
            yield from _at_most(ctx.path(None, "checkpoint", field), value, MAX_CHECKPOINT_MS)
    if cp.retain_latest > MAX_RETAIN:
        yield Issue(
            ctx.path(None, "checkpoint", "retainLatest"),
            f"must be at most {MAX_RETAIN}, got {cp.retain_latest}",
            "bounds",
        )
    if (cp.storage.local is None) == (cp.storage.s3 is None):
        yield Issue(
            ctx.path(None, "checkpoint", "storage"),
            "needs exactly one of 'local' or 's3'",
            "one-of",
        )


def _check_deployment(ctx: _Context) -> Iterator[Issue]:
    m = ctx.loaded.model
    if len(m.image) > 255 or not IMAGE_PATTERN.match(m.image):
        yield Issue(ctx.path(None, "image"), f"{m.image!r} is not an image reference", "image-format")
    for part, amounts in (("requests", m.resources.requests), ("limits", m.resources.limits)):
        for name, amount in amounts.items():
            if name not in RESOURCES:
                known = ", ".join(sorted(RESOURCES))
                yield Issue(
                    ctx.path(None, "resources", part, name), f"unknown resource (known: {known})", "resources"
                )
            elif not QUANTITY_PATTERN.match(amount):
                yield Issue(
                    ctx.path(None, "resources", part, name),
                    f"{amount!r} is not a quantity (e.g. 500m, 2, 512Mi)",
                    "resources",
                )


def backend_issues(loaded: LoadedModel, backend: str, namespace: str) -> list[Issue]:
    """What the backend adds: on Kubernetes, a namespace name and checkpoint storage every pod shares."""
    if backend != "kubernetes":
        return []
    issues = []
    if not K8S_NAME_PATTERN.match(namespace):
        issues.append(
            Issue(
                "namespace",
                f"{namespace!r} is not a Kubernetes namespace name (a DNS label)",
                "namespace-name",
            )
        )
    if loaded.model.checkpoint.storage.local is not None:
        issues.append(
            Issue(
                loaded.path("checkpoint", "storage", "local"),
                "each pod has a file system of its own, so tasks would not share checkpoints: use s3",
                "shared-storage",
            )
        )
    return issues


def _check_ids(ctx: _Context) -> Iterator[Issue]:
    seen: dict[str, ResolvedNode] = {}
    for n in ctx.nodes:
        if not n.explicit_id:
            if n.kind != "operator" or n.type in KEYED_OPERATORS:
                what = f"stateful {n.kind}" if n.kind != "operator" else f"stateful operator ({n.type})"
                yield Issue(
                    ctx.path(n, "id"),
                    f"a {what} needs an explicit id: its state is found by it",
                    "explicit-id",
                )
            continue
        if not ID_PATTERN.match(n.node_id):
            yield Issue(ctx.path(n, "id"), _id_rule_text(n.node_id), "id-format")
        elif n.node_id == RESERVED_ID:
            yield Issue(ctx.path(n, "id"), f"'{RESERVED_ID}' names the job's coordinator pods", "reserved-id")
        first = seen.get(n.node_id)
        if first is not None:
            yield Issue(
                ctx.path(n, "id"),
                f"duplicate id '{n.node_id}' (first used at {ctx.path(first)})",
                "unique-ids",
            )
        else:
            seen[n.node_id] = n


def _check_size(ctx: _Context) -> Iterator[Issue]:
    """Nodes, bounded before anything is built (tasks and channels: `plan_size_issues`)."""
    if len(ctx.nodes) > MAX_NODES:
        yield Issue(ctx.path(None, "model"), f"has {len(ctx.nodes)} nodes, at most {MAX_NODES}", "bounds")


def plan_size_issues(
    loaded: LoadedModel, vertices: Mapping[str, int], edges: list[tuple[str, str, bool]]
) -> list[Issue]:
    """Tasks and channels of a JobGraph (vertex -> parallelism; edges: source, target, forward), bounded.

    Checked between the JobGraph and the PartitionedPlan, so a refused job builds no channel.
    """
    issues = []
    tasks = sum(vertices.values())
    if tasks > MAX_TASKS:
        issues.append(Issue(loaded.path("model"), f"needs {tasks} tasks, at most {MAX_TASKS}", "bounds"))
    channels = sum(vertices[s] if forward else vertices[s] * vertices[t] for s, t, forward in edges)
    if channels > MAX_CHANNELS:
        issues.append(
            Issue(
                loaded.path("model"),
                f"needs {channels} channels (upstream x downstream parallelism on each edge that is not"
                f" forward), at most {MAX_CHANNELS}: lower the parallelism",
                "bounds",
            )
        )
    return issues


def _check_parallelism(ctx: _Context) -> Iterator[Issue]:
    shards = ctx.loaded.model.state_shard_count
    for n in ctx.nodes:
        if n.spec.parallelism is not None and n.spec.parallelism < 1:
            yield Issue(
                ctx.path(n, "parallelism"),
                f"must be at least 1, got {n.spec.parallelism}",
                "positive",
            )
        elif n.spec.parallelism is not None and n.spec.parallelism > MAX_PARALLELISM:
            yield Issue(
                ctx.path(n, "parallelism"),
                f"must be at most {MAX_PARALLELISM}, got {n.spec.parallelism}",
                "bounds",
            )
        elif n.type in KEYED_OPERATORS and n.kind == "operator" and n.parallelism > shards >= 1:
            yield Issue(
                ctx.path(n, "parallelism"),
                f"keyed operator parallelism {n.parallelism} exceeds stateShardCount {shards}",
                "shards-per-subtask",
            )


def _check_inputs(ctx: _Context) -> Iterator[Issue]:
    for n in ctx.nodes:
        if n.kind == "source":
            continue
        if not n.inputs:
            yield Issue(
                ctx.path(n, "inputs"),
                f"{n.kind} '{n.node_id}' has no input; name one in 'inputs'",
                "inputs-exist",
            )
        seen: set[tuple[str, str]] = set()
        for ref in n.inputs:
            where = ctx.path(n, "inputs", ref.position) if ref.explicit else ctx.path(n, "inputs")
            upstream = ctx.by_id.get(ref.node_id)
            if upstream is None:
                yield Issue(where, f"unknown node '{ref.node_id}'", "inputs-exist")
            elif upstream.kind == "sink":
                yield Issue(where, f"'{ref.node_id}' is a sink and has no output", "inputs-exist")
            elif ref.output not in _outputs(upstream):
                yield Issue(
                    where,
                    f"node '{ref.node_id}' has no output '{ref.output}'"
                    f" (outputs: {', '.join(sorted(_outputs(upstream)))})",
                    "inputs-exist",
                )
            if (ref.node_id, ref.output) in seen:
                yield Issue(where, f"input '{ref.node_id}' is listed twice", "inputs-unique")
            seen.add((ref.node_id, ref.output))
        if n.type == "union" and len(n.inputs) < 2:
            yield Issue(ctx.path(n, "inputs"), "a union needs at least two inputs", "union-inputs")


def _check_cycles(ctx: _Context) -> Iterator[Issue]:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    reported: set[frozenset[str]] = set()

    def visit(node: ResolvedNode, path: list[ResolvedNode]) -> Iterator[Issue]:
        state[node.node_id] = 1
        path.append(node)
        for ref in node.inputs:
            upstream = ctx.by_id.get(ref.node_id)
            if upstream is None:
                continue
            if state.get(upstream.node_id) == 1:
                start = next(i for i, p in enumerate(path) if p.node_id == upstream.node_id)
                cycle = [p.node_id for p in path[start:]]
                if frozenset(cycle) not in reported:
                    reported.add(frozenset(cycle))
                    loop = " <- ".join([*cycle, cycle[0]])
                    where = ctx.path(node, "inputs", ref.position) if ref.explicit else ctx.path(node)
                    yield Issue(where, f"cycle: {loop}", "acyclic")
            elif upstream.node_id not in state:
                yield from visit(upstream, path)
        path.pop()
        state[node.node_id] = 2

    for n in ctx.nodes:
        if n.node_id not in state:
            yield from visit(n, [])


def _check_consumed(ctx: _Context) -> Iterator[Issue]:
    graph = ctx.loaded.model.graph
    for section, nodes in (("sources", graph.sources), ("sinks", graph.sinks)):
        if not nodes:
            yield Issue(
                ctx.path(None, "model", section), f"a job needs at least one {section[:-1]}", "connected"
            )
    for n in ctx.nodes:
        if n.kind != "sink" and n.node_id not in ctx.consumers and ctx.by_id.get(n.node_id) is n:
            yield Issue(
                ctx.path(n),
                f"{n.kind} '{n.node_id}' feeds nothing; connect it to a sink or remove it",
                "connected",
            )


def _check_operators(ctx: _Context) -> Iterator[Issue]:
    for n in ctx.nodes:
        if isinstance(n.spec, OperatorSpec):
            yield from _check_operator(ctx, n, n.spec)


def _check_operator(ctx: _Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
    allowed = _FIELDS_BY_TYPE[op.type]
    for field in _OPTIONAL_FIELDS:
        if getattr(op, field) is not None and field not in allowed:
            name = field.rstrip("_")  # `async_` is `async` in the model
            yield Issue(ctx.path(n, name), f"not used by an operator of type {op.type}", "field-applies")
    if op.type in _NEEDS_FN and op.fn is None:
        yield Issue(ctx.path(n, "fn"), f"an operator of type {op.type} needs 'fn'", "fn-required")
    if op.fn is not None and not FN_PATTERN.match(op.fn):
        yield Issue(ctx.path(n, "fn"), _fn_rule_text(op.fn), "fn-format")
    if op.key is not None:
        yield from _check_key(ctx, n, op.key, ("key",))
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
            yield Issue(ctx.path(n, "aggregate", "fn"), _fn_rule_text(op.aggregate.fn), "fn-format")
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
    yield from _check_dead_letters(ctx, n, op)


def _check_async(ctx: _Context, n: ResolvedNode, a: AsyncSpec) -> Iterator[Issue]:
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
        yield from _at_most(ctx.path(n, "async", field), value, MAX_DURATION_MS)
    for field, ref in (("retryOn", a.retry_on), ("onTimeout", a.on_timeout)):
        if ref is not None and not FN_PATTERN.match(ref):
            yield Issue(ctx.path(n, "async", field), _fn_rule_text(ref), "fn-format")


def _check_lookup(ctx: _Context, n: ResolvedNode, lookup: LookupSpec | None) -> Iterator[Issue]:
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
        yield from _at_most(ctx.path(n, "lookup", "cache", "ttlMs"), lookup.cache.ttl_ms, MAX_DURATION_MS)


def _check_dead_letters(ctx: _Context, n: ResolvedNode, spec: OperatorSpec | SourceSpec) -> Iterator[Issue]:
    """`deadLetterOutput` only with `onError: dead-letter`, an id, not another output's name."""
    tag = spec.dead_letter_output
    if tag is None:
        return
    if spec.on_error != "dead-letter":
        yield Issue(ctx.path(n, "deadLetterOutput"), "needs onError: dead-letter", "field-applies")
    elif not ID_PATTERN.match(tag):
        yield Issue(ctx.path(n, "deadLetterOutput"), _id_rule_text(tag), "id-format")
    elif tag in _late_outputs(spec) or tag == MAIN_OUTPUT:
        yield Issue(ctx.path(n, "deadLetterOutput"), f"'{tag}' names another output", "distinct-outputs")


def _check_key(ctx: _Context, n: ResolvedNode, key: KeySpec, at: tuple[str | int, ...]) -> Iterator[Issue]:
    if (key.field is None) == (key.fn is None):
        yield Issue(ctx.path(n, *at), "needs exactly one of 'field' or 'fn'", "one-of")
    elif key.fn is not None and not FN_PATTERN.match(key.fn):
        yield Issue(ctx.path(n, *at, "fn"), _fn_rule_text(key.fn), "fn-format")


def _check_keys(ctx: _Context, n: ResolvedNode, op: OperatorSpec, keys: list[KeySpec]) -> Iterator[Issue]:
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
        yield from _check_key(ctx, n, key, ("keys", i))


def _check_broadcast(
    ctx: _Context, n: ResolvedNode, op: OperatorSpec, broadcast: list[str]
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


def _check_keyed(ctx: _Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
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
            + ", ".join(sorted(_describe_key(k) for k in distinct)),
            "one-key",
        )


def _check_window(ctx: _Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
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
        yield from _at_most(
            ctx.path(n, "window", "allowedLatenessMs"), w.allowed_lateness_ms, MAX_DURATION_MS
        )
    if w.late_output is not None and not ID_PATTERN.match(w.late_output):
        yield Issue(ctx.path(n, "window", "lateOutput"), _id_rule_text(w.late_output), "id-format")
    if (op.aggregate is None) == (op.fn is None):
        yield Issue(
            ctx.path(n),
            "a window needs exactly one of 'aggregate' or 'fn' (a function over the window's records)",
            "one-of",
        )
    if w.time == "event":
        yield from _check_event_time(ctx, n, ("window", "time"))


def _check_ttl(ctx: _Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
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
        yield from _at_most(ctx.path(n, "stateTtlMs"), op.state_ttl_ms, MAX_DURATION_MS)
    if temporal and op.state_ttl_time == "processing":
        yield Issue(
            ctx.path(n, "stateTtlTime"),
            "a temporal join's versions expire in event time only (a version valid for stateTtlMs"
            " after its timestamp)",
            "join-time",
        )
    elif op.state_ttl_time in (None, "event"):
        yield from _check_event_time(ctx, n, ("stateTtlMs",))


def _check_window_shape(
    ctx: _Context, n: ResolvedNode, w: WindowSpec, at: tuple[str, ...]
) -> Iterator[Issue]:
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
            yield from _at_most(ctx.path(n, *at, field), value, MAX_DURATION_MS)
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


def _check_join(ctx: _Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
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
        yield Issue(ctx.path(n, "join", "lateOutput"), _id_rule_text(j.late_output), "id-format")
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


def _check_join_window(ctx: _Context, n: ResolvedNode, w: WindowSpec | None) -> Iterator[Issue]:
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


def _check_pattern(ctx: _Context, n: ResolvedNode, op: OperatorSpec) -> Iterator[Issue]:
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
            yield Issue(ctx.path(n, "pattern", "steps", i, "where"), _fn_rule_text(step.where), "fn-format")
    if p.within_ms is None or p.within_ms < 1:
        yield Issue(ctx.path(n, "pattern", "withinMs"), "a pattern needs withinMs of at least 1", "within")
    else:
        yield from _at_most(ctx.path(n, "pattern", "withinMs"), p.within_ms, MAX_DURATION_MS)
    if p.time is None:
        yield Issue(
            ctx.path(n, "pattern", "time"),
            "a pattern needs a time characteristic: 'event' or 'processing'",
            "window-time",
        )
    elif p.time == "event":
        yield from _check_event_time(ctx, n, ("pattern", "time"))


def _at_most(path: str, value: int, bound: int) -> Iterator[Issue]:
    """A `bounds` issue at `path` when `value` is above `bound`."""
    if value > bound:
        yield Issue(path, f"must be at most {bound:,}, got {value:,}", "bounds")


def _check_event_time(ctx: _Context, n: ResolvedNode, at: tuple[str, ...]) -> Iterator[Issue]:
    for src in _upstream_sources(ctx, n):
        if isinstance(src.spec, SourceSpec) and src.spec.watermark is None:
            yield Issue(
                ctx.path(n, *at),
                f"event time needs a watermark strategy on source '{src.node_id}'",
                "event-time-watermarks",
            )


def _check_connector(
    ctx: _Context, n: ResolvedNode, catalogue: Mapping[str, SourceType | SinkType]
) -> Iterator[Issue]:
    kind = catalogue.get(n.type)
    if kind is None:
        yield Issue(
            ctx.path(n, "type"),
            f"unknown {n.kind} type '{n.type}' (known: {', '.join(sorted(catalogue))})",
            "connector-type",
        )
    else:
        yield from _check_config(ctx, n, kind.config)


def _check_sources(ctx: _Context) -> Iterator[Issue]:
    for n in ctx.nodes:
        if not isinstance(n.spec, SourceSpec):
            continue
        yield from _check_connector(ctx, n, SOURCE_TYPES)
        yield from _check_dead_letters(ctx, n, n.spec)
        wm = n.spec.watermark
        own = n.type in SOURCE_TYPES and SOURCE_TYPES[n.type].timestamps
        if wm is not None:
            given = (wm.timestamp_field is not None) + (wm.timestamp_fn is not None)
            if given == 2 or (given == 0 and not own):
                yield Issue(
                    ctx.path(n, "watermark"),
                    f"needs {'at most' if own else 'exactly'} one of 'timestampField' or 'timestampFn'"
                    + (" (with neither, the records' own timestamps)" if own else ""),
                    "one-of",
                )
            if wm.max_out_of_orderness_ms < 0:
                yield Issue(
                    ctx.path(n, "watermark", "maxOutOfOrdernessMs"),
                    "must not be negative",
                    "non-negative",
                )
            else:
                path = ctx.path(n, "watermark", "maxOutOfOrdernessMs")
                yield from _at_most(path, wm.max_out_of_orderness_ms, MAX_DURATION_MS)
            if wm.idle_timeout_ms is not None and wm.idle_timeout_ms < 1:
                yield Issue(
                    ctx.path(n, "watermark", "idleTimeoutMs"),
                    f"must be at least 1, got {wm.idle_timeout_ms}",
                    "positive",
                )
            elif wm.idle_timeout_ms is not None:
                yield from _at_most(
                    ctx.path(n, "watermark", "idleTimeoutMs"), wm.idle_timeout_ms, MAX_DURATION_MS
                )


def _check_sinks(ctx: _Context) -> Iterator[Issue]:
    for n in ctx.nodes:
        if not isinstance(n.spec, SinkSpec):
            continue
        yield from _check_connector(ctx, n, SINK_TYPES)
        if n.spec.key is not None:
            yield from _check_key(ctx, n, n.spec.key, ("key",))
            if n.spec.partitioning is not None:
                yield Issue(
                    ctx.path(n, "partitioning"),
                    "a sink with 'key' is partitioned by it, not by 'partitioning'",
                    "partitioning-applies",
                )
        kind = SINK_TYPES.get(n.type)
        if kind is None or n.spec.key is not None or n.parallelism == 1:
            continue
        with contextlib.suppress(ValidationError):  # an invalid config is reported by _check_connector
            if kind.config.model_validate(n.spec.config).rows_replace_by_key():
                yield Issue(
                    ctx.path(n, "key"),
                    f"an upsert sink at parallelism {n.parallelism} needs 'key' (the fields of its upsert"
                    " keys): the rows of one key must reach one subtask, in order",
                    "upsert-key",
                )


SYSTEM_DIRECTORIES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib64",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
)
"""Directories a job never writes into (as root it could): `/` itself and everything under these."""


def write_path_problem(path: str) -> str | None:
    """Why a job may not write under `path` (a file sink, local checkpoints), or None."""
    if not path.strip():
        return "must not be empty (it would be the working directory)"
    if path.startswith("~"):
        return f"'{path}' starts with '~', which is not expanded: write the directory out"
    parts = path.replace("\\", "/").split("/")
    if ".." in parts:
        return f"'{path}' must not go up with '..'"
    if path.startswith("/"):
        normal = "/" + "/".join(p for p in parts if p and p != ".")
        if normal == "/" or any(normal == d or normal.startswith(d + "/") for d in SYSTEM_DIRECTORIES):
            return f"'{path}' is a system directory"
    return None


def _check_paths(ctx: _Context) -> Iterator[Issue]:
    local = ctx.loaded.model.checkpoint.storage.local
    if local is not None and (problem := write_path_problem(local.path)) is not None:
        yield Issue(ctx.path(None, "checkpoint", "storage", "local", "path"), problem, "write-path")
    for n in ctx.nodes:
        if isinstance(n.spec, SinkSpec) and n.type == "file" and isinstance(n.spec.config.get("path"), str):
            problem = write_path_problem(n.spec.config["path"])
            if problem is not None:
                yield Issue(ctx.path(n, "config", "path"), problem, "write-path")


def _check_config(ctx: _Context, n: ResolvedNode, schema: type[ConnectorConfig]) -> Iterator[Issue]:
    config = n.spec.config if isinstance(n.spec, (SourceSpec, SinkSpec)) else {}
    try:
        schema.model_validate(config)
    except ValidationError as exc:
        yield from pydantic_issues(exc, (*ctx.loaded.prefix, "model", n.section, n.index, "config"))


def _check_semantics(ctx: _Context) -> Iterator[Issue]:
    mode = ctx.loaded.model.semantic_mode
    sources_ok, sinks_ok = ALLOWED[mode]
    for n in ctx.nodes:
        if n.kind == "source" and n.type in SOURCE_TYPES:
            cap = SOURCE_TYPES[n.type].capability
            if cap not in sources_ok:
                yield Issue(
                    ctx.path(n, "type"),
                    f"source '{n.node_id}' ({n.type}) is {cap.value}; semanticMode {mode.value}"
                    f" needs {_either(sources_ok)}",
                    "semantic-mode",
                )
        elif n.kind == "sink" and n.type in SINK_TYPES:
            sink_cap = SINK_TYPES[n.type].capability
            if sink_cap not in sinks_ok:
                yield Issue(
                    ctx.path(n, "type"),
                    f"sink '{n.node_id}' ({n.type}) is {sink_cap.value}; semanticMode {mode.value}"
                    f" needs {_either(sinks_ok)}",
                    "semantic-mode",
                )


def _check_partitioning(ctx: _Context) -> Iterator[Issue]:
    for n in ctx.nodes:
        spec = n.spec
        if isinstance(spec, (OperatorSpec, SinkSpec)) and spec.partitioning == "forward":
            for ref in n.inputs:
                upstream = ctx.by_id.get(ref.node_id)
                if upstream is not None and upstream.parallelism != n.parallelism:
                    yield Issue(
                        ctx.path(n, "partitioning"),
                        f"forward needs equal parallelism, but '{ref.node_id}' has"
                        f" {upstream.parallelism} and '{n.node_id}' has {n.parallelism}",
                        "forward-parallelism",
                    )


def _outputs(node: ResolvedNode) -> set[str]:
    spec = node.spec
    outputs = {MAIN_OUTPUT}
    if isinstance(spec, OperatorSpec | SourceSpec):
        outputs |= _late_outputs(spec)
        if spec.on_error == "dead-letter":
            outputs.add(spec.dead_letter_output or DEAD_LETTER)
    return outputs


def _late_outputs(spec: OperatorSpec | SourceSpec) -> set[str]:
    parts = (spec.window, spec.join) if isinstance(spec, OperatorSpec) else ()
    return {p.late_output for p in parts if p is not None and p.late_output is not None}


def _upstream_sources(ctx: _Context, node: ResolvedNode) -> list[ResolvedNode]:
    found: dict[str, ResolvedNode] = {}
    stack, seen = [node], {node.node_id}
    while stack:
        current = stack.pop()
        for ref in current.inputs:
            up = ctx.by_id.get(ref.node_id)
            if up is None or up.node_id in seen:
                continue
            seen.add(up.node_id)
            if up.kind == "source":
                found[up.node_id] = up
            stack.append(up)
    return [found[k] for k in sorted(found)]


def _describe_key(key: KeySpec) -> str:
    return f"field '{key.field}'" if key.field is not None else f"fn '{key.fn}'"


def _either(options: frozenset[str]) -> str:
    names = sorted(str(o) for o in options)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _id_rule_text(value: str) -> str:
    return (
        f"'{value}' is not a valid id: lower-case letters, digits and '-',"
        " 1 to 40 characters, starting and ending with a letter or digit"
    )


def _fn_rule_text(value: str) -> str:
    return f"'{value}' is not a function reference of the form 'module:attribute'"


_CHECKS: tuple[Check, ...] = (
    _check_job,
    _check_deployment,
    _check_ids,
    _check_parallelism,
    _check_size,
    _check_inputs,
    _check_cycles,
    _check_consumed,
    _check_operators,
    _check_sources,
    _check_sinks,
    _check_paths,
    _check_semantics,
    _check_partitioning,
)
