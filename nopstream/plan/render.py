"""Text renderings of plans for people: what `nopstream plan` prints."""

from __future__ import annotations

from nopstream.plan.canonical import fingerprint
from nopstream.plan.compiler import Plan
from nopstream.plan.deployment import DeploymentPlan
from nopstream.plan.jobgraph import JobGraph
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.plan.streamgraph import JobIdentity, StreamGraph


def _header(title: str, ident: JobIdentity, plan: object) -> list[str]:
    return [
        f"{title} of job '{ident.job_id}' pipeline '{ident.pipeline_id}'"
        f" (namespace {ident.checkpoint_namespace}, planVersion {ident.plan_version})",
        f"  semanticMode {ident.semantic_mode.value}, stateShardCount {ident.state_shard_count},"
        f" hash {ident.hash_policy}",
        f"  fingerprint {fingerprint(plan)}",
    ]


def render_stream(graph: StreamGraph) -> str:
    """The logical DAG: nodes with their type and parallelism, edges with their policy."""
    lines = _header("StreamGraph", graph.identity, graph)
    lines.append("nodes:")
    for n in graph.nodes:
        key = f" key {n.key.describe()}" if n.key else ""
        lines.append(f"  {n.node_id:<24} {n.kind:<8} {n.type:<10} parallelism {n.parallelism}{key}")
    lines.append("edges:")
    for e in graph.edges:
        key = f" by {e.key.describe()}" if e.key else ""
        lines.append(f"  {e.edge_id:<40} {e.policy.value}{key}")
    return "\n".join(lines)


def render_job(graph: JobGraph) -> str:
    """The vertices with their chains, and the edges between vertices."""
    lines = _header("JobGraph", graph.identity, graph)
    lines.append("vertices:")
    for v in graph.vertices:
        chain = " -> ".join(n.node_id for n in v.chain)
        lines.append(f"  {v.vertex_id:<24} parallelism {v.parallelism:<4} chain [{chain}]")
    lines.append("edges:")
    for e in graph.edges:
        key = f" by {e.key.describe()}" if e.key else ""
        lines.append(f"  {e.edge_id:<40} {e.source_vertex} -> {e.target_vertex} {e.policy.value}{key}")
    return "\n".join(lines)


def render_partitioned(plan: PartitionedPlan) -> str:
    """Vertices, subtasks, edges with policy and channel counts, shard ranges, splits."""
    lines = _header("PartitionedPlan", plan.identity, plan)
    lines.append("vertices:")
    for v in plan.vertices:
        chain = " -> ".join(op.node_id for op in v.operators)
        keyed = "keyed" if v.keyed else "not keyed"
        lines.append(f"  {v.vertex_id}: parallelism {v.parallelism}, {keyed}, chain [{chain}]")
        for s in v.subtasks:
            shards = f" shards [{s.shards.start}, {s.shards.end})" if s.shards else ""
            lines.append(f"    subtask {s.index}: {s.task_id}{shards}")
    lines.append("edges:")
    for e in plan.edges:
        key = f" by {e.key.describe()}" if e.key else ""
        lines.append(
            f"  {e.edge_id}: {e.source_vertex} -> {e.target_vertex} {e.policy.value}{key},"
            f" {len(e.channels)} channels"
        )
    lines.append("sources:")
    for src in plan.sources:
        if src.assignment is not None:
            parts = "; ".join(
                f"subtask {i}: {', '.join(splits) or '-'}" for i, splits in enumerate(src.assignment)
            )
            lines.append(f"  {src.operator_id}: static splits ({parts})")
        else:
            lines.append(
                f"  {src.operator_id}: splits discovered at run time, {src.policy} by {src.hash_policy}"
            )
    lines.append(f"checkpoint ACK set: {len(plan.ack_set)} tasks")
    return "\n".join(lines)


def render_deployment(plan: DeploymentPlan) -> str:
    """Where each task runs and what it is bound to."""
    storage = plan.storage
    where = storage.path if storage.kind == "local" else f"s3://{storage.bucket}/{storage.prefix or ''}"
    lines = [
        f"DeploymentPlan of job '{plan.job_id}' pipeline '{plan.pipeline_id}'"
        f" on backend {plan.backend} (namespace {plan.namespace}, transport {plan.transport})",
        f"  partitioned plan {plan.partitioned_fingerprint}",
        f"  etcd prefix {plan.etcd_prefix}",
        f"  checkpoint storage {storage.kind} {where}; every {plan.checkpoint.interval_ms} ms,"
        f" timeout {plan.checkpoint.timeout_ms} ms, keep {plan.checkpoint.retain_latest}",
        f"  image {plan.image}",
        f"  coordinators: {', '.join(plan.coordinators)}",
        "tasks:",
    ]
    for t in plan.tasks:
        lines.append(f"  {t.name:<40} {t.task_id} at {t.endpoint}")
    return "\n".join(lines)


def render(plan: Plan) -> str:
    """The text rendering of a plan of any layer."""
    if isinstance(plan, StreamGraph):
        return render_stream(plan)
    if isinstance(plan, JobGraph):
        return render_job(plan)
    if isinstance(plan, PartitionedPlan):
        return render_partitioned(plan)
    return render_deployment(plan)
