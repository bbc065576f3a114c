"""The rules of sources and sinks: known types, their configuration, watermarks and keys."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from pydantic import ValidationError

from nopstream.model.catalogue import SINK_TYPES, SOURCE_TYPES, SinkType, SourceType
from nopstream.model.connector_config import ConnectorConfig
from nopstream.model.errors import Issue
from nopstream.model.load import pydantic_issues
from nopstream.model.spec import (
    SinkSpec,
    SourceSpec,
)
from nopstream.plan.nodes import ResolvedNode
from nopstream.plan.validation.operators import check_dead_letters, check_key
from nopstream.plan.validation.rules import MAX_DURATION_MS, Context, at_most


def _check_connector(
    ctx: Context, n: ResolvedNode, catalogue: Mapping[str, SourceType | SinkType]
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


def check_sources(ctx: Context) -> Iterator[Issue]:
    """Known source types, valid configurations, dead letters and watermark strategies."""
    for n in ctx.nodes:
        if not isinstance(n.spec, SourceSpec):
            continue
        yield from _check_connector(ctx, n, SOURCE_TYPES)
        yield from check_dead_letters(ctx, n, n.spec)
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
                yield from at_most(path, wm.max_out_of_orderness_ms, MAX_DURATION_MS)
            if wm.idle_timeout_ms is not None and wm.idle_timeout_ms < 1:
                yield Issue(
                    ctx.path(n, "watermark", "idleTimeoutMs"),
                    f"must be at least 1, got {wm.idle_timeout_ms}",
                    "positive",
                )
            elif wm.idle_timeout_ms is not None:
                yield from at_most(
                    ctx.path(n, "watermark", "idleTimeoutMs"), wm.idle_timeout_ms, MAX_DURATION_MS
                )


def check_sinks(ctx: Context) -> Iterator[Issue]:
    """Known sink types, valid configurations, and keys where rows are partitioned or upserted."""
    for n in ctx.nodes:
        if not isinstance(n.spec, SinkSpec):
            continue
        yield from _check_connector(ctx, n, SINK_TYPES)
        if n.spec.key is not None:
            yield from check_key(ctx, n, n.spec.key, ("key",))
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


def _check_config(ctx: Context, n: ResolvedNode, schema: type[ConnectorConfig]) -> Iterator[Issue]:
    config = n.spec.config if isinstance(n.spec, (SourceSpec, SinkSpec)) else {}
    try:
        schema.model_validate(config)
    except ValidationError as exc:
        yield from pydantic_issues(exc, (*ctx.loaded.prefix, "model", n.section, n.index, "config"))
