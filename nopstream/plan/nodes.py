"""Resolution of a model's nodes: ids, inputs and parallelism with their defaults applied.

Defaults (docs/model.md): a stateless operator without `id` is `operators-{index}`;
an operator without `inputs` reads the operator before it, or the only source when it
is the first; a sink without `inputs` reads the last operator (or the only source);
a node without `parallelism` takes the job's `parallelism`. Resolution never fails:
what it cannot resolve is left empty for validation to report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nopstream.model.spec import KeySpec, OperatorSpec, SinkSpec, SourceSpec, StreamModel

NodeKind = Literal["source", "operator", "sink"]
MAIN_OUTPUT = "main"
DEAD_LETTER = "dead-letter"
"""The side output an operator or source with `onError: dead-letter` sets records aside on, unless its
`deadLetterOutput` names another."""


@dataclass(frozen=True)
class InputRef:
    """One entry of a node's inputs: `node` or `node:output`, and where it was written."""

    node_id: str
    output: str
    position: int
    explicit: bool


@dataclass(frozen=True)
class ResolvedNode:
    """A model node with its defaults applied and the model path it came from."""

    kind: NodeKind
    section: Literal["sources", "operators", "sinks"]
    index: int
    node_id: str
    explicit_id: bool
    type: str
    parallelism: int
    inputs: tuple[InputRef, ...]
    spec: SourceSpec | OperatorSpec | SinkSpec


def parse_input(ref: str, position: int) -> InputRef:
    """Split an input reference `node` or `node:output` into its parts."""
    node, sep, output = ref.partition(":")
    return InputRef(node, output if sep else MAIN_OUTPUT, position, explicit=True)


def resolve_nodes(model: StreamModel) -> tuple[ResolvedNode, ...]:
    """Every node of the model, sources then operators then sinks, with defaults applied."""
    graph = model.graph
    nodes: list[ResolvedNode] = []
    for i, src in enumerate(graph.sources):
        nodes.append(_node(model, "source", "sources", i, src, src.id or "", ()))
    only_source = graph.sources[0].id if len(graph.sources) == 1 else None
    previous: str | None = only_source
    for i, op in enumerate(graph.operators):
        op_id = op.id or f"operators-{i}"
        nodes.append(_node(model, "operator", "operators", i, op, op_id, _inputs(op.inputs, previous)))
        previous = op_id
    last = previous if graph.operators else only_source
    for i, sink in enumerate(graph.sinks):
        nodes.append(_node(model, "sink", "sinks", i, sink, sink.id or "", _inputs(sink.inputs, last)))
    return tuple(nodes)


def _inputs(explicit: list[str] | None, default: str | None) -> tuple[InputRef, ...]:
    if explicit is not None:
        return tuple(parse_input(ref, pos) for pos, ref in enumerate(explicit))
    if default is None:
        return ()
    return (InputRef(default, MAIN_OUTPUT, 0, explicit=False),)


def _node(
    model: StreamModel,
    kind: NodeKind,
    section: Literal["sources", "operators", "sinks"],
    index: int,
    spec: SourceSpec | OperatorSpec | SinkSpec,
    node_id: str,
    inputs: tuple[InputRef, ...],
) -> ResolvedNode:
    return ResolvedNode(
        kind=kind,
        section=section,
        index=index,
        node_id=node_id,
        explicit_id=spec.id is not None,
        type=spec.type,
        parallelism=spec.parallelism if spec.parallelism is not None else model.parallelism,
        inputs=inputs,
        spec=spec,
    )


def input_keys(node: ResolvedNode, by_id: dict[str, ResolvedNode]) -> list[KeySpec]:
    """The key selectors a node's inputs arrive keyed by (from key_by inputs)."""
    keys = []
    for ref in node.inputs:
        upstream = by_id.get(ref.node_id)
        if upstream is not None and upstream.type == "key_by" and upstream.kind == "operator":
            spec = upstream.spec
            if isinstance(spec, OperatorSpec) and spec.key is not None:
                keys.append(spec.key)
    return keys


def effective_key(node: ResolvedNode, by_id: dict[str, ResolvedNode]) -> KeySpec | None:
    """The key a keyed operator's state is partitioned by: its own (its first input's, with one per
    input), else its key_by input's."""
    spec = node.spec
    if isinstance(spec, OperatorSpec) and spec.key is not None and spec.type != "key_by":
        return spec.key
    if isinstance(spec, OperatorSpec) and spec.keys:
        return spec.keys[0]
    keys = input_keys(node, by_id)
    return keys[0] if keys else None
