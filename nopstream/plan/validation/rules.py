"""What every rule of the validation shares: the model's context, patterns, bounds and messages."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property

from nopstream.model.errors import Issue
from nopstream.model.load import LoadedModel
from nopstream.model.spec import (
    KeySpec,
    OperatorSpec,
    SourceSpec,
)
from nopstream.plan.nodes import DEAD_LETTER, MAIN_OUTPUT, ResolvedNode

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


@dataclass
class Context:
    """The model being validated and its resolved nodes, with the lookups every rule uses."""

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


Check = Callable[[Context], Iterator[Issue]]


def at_most(path: str, value: int, bound: int) -> Iterator[Issue]:
    """A `bounds` issue at `path` when `value` is above `bound`."""
    if value > bound:
        yield Issue(path, f"must be at most {bound:,}, got {value:,}", "bounds")


def outputs(node: ResolvedNode) -> set[str]:
    """The names of a node's outputs: main, late and dead-letter ones."""
    spec = node.spec
    outputs = {MAIN_OUTPUT}
    if isinstance(spec, OperatorSpec | SourceSpec):
        outputs |= late_outputs(spec)
        if spec.on_error == "dead-letter":
            outputs.add(spec.dead_letter_output or DEAD_LETTER)
    return outputs


def late_outputs(spec: OperatorSpec | SourceSpec) -> set[str]:
    """The outputs a window or join sends its late records to."""
    parts = (spec.window, spec.join) if isinstance(spec, OperatorSpec) else ()
    return {p.late_output for p in parts if p is not None and p.late_output is not None}


def upstream_sources(ctx: Context, node: ResolvedNode) -> list[ResolvedNode]:
    """The sources upstream of `node`, by id."""
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


def describe_key(key: KeySpec) -> str:
    """A key in words."""
    return f"field '{key.field}'" if key.field is not None else f"fn '{key.fn}'"


def either(options: frozenset[str]) -> str:
    """ "a", "a or b", "a, b or c"."""
    names = sorted(str(o) for o in options)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def id_rule_text(value: str) -> str:
    """Why `value` is not an id."""
    return (
        f"'{value}' is not a valid id: lower-case letters, digits and '-',"
        " 1 to 40 characters, starting and ending with a letter or digit"
    )


def fn_rule_text(value: str) -> str:
    """Why `value` is not a function reference."""
    return f"'{value}' is not a function reference of the form 'module:attribute'"
