"""Which class runs each operator type."""

from __future__ import annotations

from collections.abc import Callable

from nopstream.runtime.operators import aggregates, async_io, cep, joins, lookups, process, stateless, windows
from nopstream.runtime.operators.base import Context, Operator

OPERATORS: dict[str, Callable[[Context], Operator]] = {
    "map": stateless.Map,
    "filter": stateless.Filter,
    "flat_map": stateless.FlatMap,
    "async_map": async_io.AsyncMap,
    "async_flat_map": async_io.async_flat_map,
    "lookup": lookups.Lookup,
    "key_by": stateless.PassThrough,
    "union": stateless.PassThrough,
    "aggregate": aggregates.Aggregate,
    "reduce": aggregates.Reduce,
    "window": windows.Window,
    "process": process.Process,
    "cep": cep.Cep,
    "join": joins.join,
}


def build_operator(ctx: Context) -> Operator:
    """The operator instance for a chained operator node."""
    return OPERATORS[ctx.node.type](ctx)
