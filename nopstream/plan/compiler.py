"""The compiler: a validated model down through every plan layer, and plan documents.

A plan document is the JSON form of one layer with its fingerprint:
`{"layer": "partitioned", "fingerprint": "sha256:...", "plan": {...}}`. Loading a
document checks the fingerprint, so a plan edited by hand is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from nopstream.model.errors import Issue, ModelError
from nopstream.model.load import LoadedModel
from nopstream.plan.canonical import fingerprint, from_plain, plain_json, to_plain
from nopstream.plan.deployment import DeploymentPlan, build_deployment_plan
from nopstream.plan.jobgraph import JobGraph, build_job_graph
from nopstream.plan.partitioned import PartitionedPlan, build_partitioned_plan
from nopstream.plan.streamgraph import EdgePolicy, StreamGraph, build_stream_graph
from nopstream.plan.validation import backend_issues, plan_size_issues, validate

Plan = StreamGraph | JobGraph | PartitionedPlan | DeploymentPlan
L = TypeVar("L", StreamGraph, JobGraph, PartitionedPlan, DeploymentPlan)
LAYERS: dict[str, type[Any]] = {
    "stream": StreamGraph,
    "job": JobGraph,
    "partitioned": PartitionedPlan,
    "deployment": DeploymentPlan,
}


@dataclass(frozen=True)
class CompiledPlans:
    """Every layer of one compiled model."""

    stream: StreamGraph
    job: JobGraph
    partitioned: PartitionedPlan
    deployment: DeploymentPlan

    def layer(self, name: str) -> Plan:
        """The plan of the named layer (`stream`, `job`, `partitioned`, `deployment`)."""
        plan: Plan = getattr(self, name)
        return plan


def compile_model(loaded: LoadedModel, *, backend: str = "local", namespace: str = "local") -> CompiledPlans:
    """Validate and compile a model for a backend; raise `ModelError` with every issue when invalid."""
    issues = validate(loaded) + backend_issues(loaded, backend, namespace)
    if issues:
        raise ModelError(issues)
    stream = build_stream_graph(loaded.model, scope=namespace if backend == "kubernetes" else None)
    job = build_job_graph(stream)
    vertices = {v.vertex_id: v.parallelism for v in job.vertices}
    edges = [(e.source_vertex, e.target_vertex, e.policy is EdgePolicy.FORWARD) for e in job.edges]
    issues = plan_size_issues(loaded, vertices, edges)
    if issues:
        raise ModelError(issues)
    partitioned = build_partitioned_plan(job)
    deployment = build_deployment_plan(loaded.model, partitioned, backend=backend, namespace=namespace)
    return CompiledPlans(stream, job, partitioned, deployment)


def layer_name(plan: Plan) -> str:
    """The layer name of a plan object."""
    for name, cls in LAYERS.items():
        if isinstance(plan, cls):
            return name
    raise TypeError(f"not a plan: {type(plan).__name__}")


def dump_document(plan: Plan) -> str:
    """The plan document of a plan, as canonical JSON text."""
    plain = to_plain(plan)
    doc = {"layer": layer_name(plan), "fingerprint": fingerprint(plan), "plan": plain}
    return plain_json(doc).decode("utf-8")


def read_document(path: Path, layer: type[L]) -> L:
    """The plan of `layer` in the plan document file `path`; ValueError naming the file when it holds
    another layer (ModelError when it is no plan document, OSError when it cannot be read)."""
    plan = load_document(path.read_text(), origin=str(path))
    if not isinstance(plan, layer):
        raise ValueError(f"{path} holds a {layer_name(plan)} plan, not a {layer_name_of(layer)} plan")
    return plan


def layer_name_of(layer: type[Plan]) -> str:
    """The layer name of a plan class."""
    return next(name for name, cls in LAYERS.items() if cls is layer)


def load_document(text: str, *, origin: str = "<plan>") -> Plan:
    """Rebuild a plan from its document; refuse a wrong layer or a fingerprint mismatch."""
    try:
        doc = json.loads(text)
        cls = LAYERS[doc["layer"]]
        plan: Plan = from_plain(cls, doc["plan"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError([Issue(origin, f"not a plan document: {exc!r}", "plan-document")]) from None
    actual = fingerprint(plan)
    if actual != doc.get("fingerprint"):
        raise ModelError(
            [
                Issue(
                    f"{origin}: fingerprint",
                    f"is {doc.get('fingerprint')!r} but the plan hashes to {actual!r}",
                    "plan-fingerprint",
                )
            ]
        )
    return plan
