"""The rules of the job as a whole: ids, sizes, parallelism, deployment, paths written and semantics."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from nopstream.model.capabilities import ALLOWED
from nopstream.model.catalogue import SINK_TYPES, SOURCE_TYPES, local_directory
from nopstream.model.errors import Issue
from nopstream.model.load import LoadedModel
from nopstream.model.spec import (
    KEYED_OPERATORS,
    SinkSpec,
)
from nopstream.plan.nodes import ResolvedNode
from nopstream.plan.validation.rules import (
    ID_PATTERN,
    IMAGE_PATTERN,
    K8S_NAME_PATTERN,
    MAX_CHANNELS,
    MAX_CHECKPOINT_MS,
    MAX_NAMESPACE,
    MAX_NODES,
    MAX_PARALLELISM,
    MAX_RETAIN,
    MAX_STATE_SHARDS,
    MAX_TASKS,
    NAMESPACE_PATTERN,
    QUANTITY_PATTERN,
    RESERVED_ID,
    RESOURCES,
    Context,
    at_most,
    either,
    id_rule_text,
)


def check_job(ctx: Context) -> Iterator[Issue]:
    """Ids, counts and bounds of the job, its checkpoint namespace and settings, one storage."""
    m = ctx.loaded.model
    if m.job_id is not None and not ID_PATTERN.match(m.job_id):
        yield Issue(ctx.path(None, "jobId"), id_rule_text(m.job_id), "id-format")
    if not ID_PATTERN.match(m.pipeline_id):
        yield Issue(ctx.path(None, "pipelineId"), id_rule_text(m.pipeline_id), "id-format")
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
            yield from at_most(ctx.path(None, "checkpoint", field), value, MAX_CHECKPOINT_MS)
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


def check_deployment(ctx: Context) -> Iterator[Issue]:
    """The image reference and the resources asked for."""
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


def check_ids(ctx: Context) -> Iterator[Issue]:
    """Explicit ids where state is found by them, well formed, not reserved, unique."""
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
            yield Issue(ctx.path(n, "id"), id_rule_text(n.node_id), "id-format")
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


def check_size(ctx: Context) -> Iterator[Issue]:
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


def check_parallelism(ctx: Context) -> Iterator[Issue]:
    """Each parallelism within bounds, a keyed one at most the state shard count."""
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


def check_paths(ctx: Context) -> Iterator[Issue]:
    """Local checkpoints and file sinks write nowhere a job must not."""
    local = ctx.loaded.model.checkpoint.storage.local
    if local is not None and (problem := write_path_problem(local.path)) is not None:
        yield Issue(ctx.path(None, "checkpoint", "storage", "local", "path"), problem, "write-path")
    for n in ctx.nodes:
        directory = local_directory(n.type, n.spec.config) if isinstance(n.spec, SinkSpec) else None
        if directory is not None and (problem := write_path_problem(directory[1])) is not None:
            yield Issue(ctx.path(n, "config", directory[0]), problem, "write-path")


def check_semantics(ctx: Context) -> Iterator[Issue]:
    """Every source and sink can give the semantic mode the job asks for."""
    mode = ctx.loaded.model.semantic_mode
    sources_ok, sinks_ok = ALLOWED[mode]
    for n in ctx.nodes:
        if n.kind == "source" and n.type in SOURCE_TYPES:
            cap = SOURCE_TYPES[n.type].capability
            if cap not in sources_ok:
                yield Issue(
                    ctx.path(n, "type"),
                    f"source '{n.node_id}' ({n.type}) is {cap.value}; semanticMode {mode.value}"
                    f" needs {either(sources_ok)}",
                    "semantic-mode",
                )
        elif n.kind == "sink" and n.type in SINK_TYPES:
            sink_cap = SINK_TYPES[n.type].capability
            if sink_cap not in sinks_ok:
                yield Issue(
                    ctx.path(n, "type"),
                    f"sink '{n.node_id}' ({n.type}) is {sink_cap.value}; semanticMode {mode.value}"
                    f" needs {either(sinks_ok)}",
                    "semantic-mode",
                )
