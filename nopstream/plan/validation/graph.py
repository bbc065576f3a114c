"""The rules of the graph: inputs that exist, no cycles, every node consumed, forward edges."""

from __future__ import annotations

from collections.abc import Iterator

from nopstream.model.errors import Issue
from nopstream.model.spec import (
    OperatorSpec,
    SinkSpec,
)
from nopstream.plan.nodes import ResolvedNode
from nopstream.plan.validation.rules import Context, outputs


def check_inputs(ctx: Context) -> Iterator[Issue]:
    """Every input names an existing output of a node that is not a sink, once; unions have two."""
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
            elif ref.output not in outputs(upstream):
                yield Issue(
                    where,
                    f"node '{ref.node_id}' has no output '{ref.output}'"
                    f" (outputs: {', '.join(sorted(outputs(upstream)))})",
                    "inputs-exist",
                )
            if (ref.node_id, ref.output) in seen:
                yield Issue(where, f"input '{ref.node_id}' is listed twice", "inputs-unique")
            seen.add((ref.node_id, ref.output))
        if n.type == "union" and len(n.inputs) < 2:
            yield Issue(ctx.path(n, "inputs"), "a union needs at least two inputs", "union-inputs")


def check_cycles(ctx: Context) -> Iterator[Issue]:
    """No cycle, each reported once at the input that closes it."""
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


def check_consumed(ctx: Context) -> Iterator[Issue]:
    """At least one source and one sink; every node but a sink feeds something."""
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


def check_partitioning(ctx: Context) -> Iterator[Issue]:
    """A forward edge joins nodes of equal parallelism."""
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
