"""Validation of a StreamModel: every rule of docs/validation.md, all issues at once.

`validate(loaded)` returns every `Issue` found, sorted by field path; an empty list
means the model compiles. Each issue names the field path, what is wrong and the
rule, so the CLI, the operator and a webhook can all show the same message.
"""

from __future__ import annotations

from nopstream.model.errors import Issue
from nopstream.model.load import LoadedModel
from nopstream.plan.nodes import resolve_nodes
from nopstream.plan.validation.connectors import check_sinks, check_sources
from nopstream.plan.validation.graph import check_consumed, check_cycles, check_inputs, check_partitioning
from nopstream.plan.validation.job import (
    backend_issues,
    check_deployment,
    check_ids,
    check_job,
    check_parallelism,
    check_paths,
    check_semantics,
    check_size,
    plan_size_issues,
)
from nopstream.plan.validation.operators import check_operators
from nopstream.plan.validation.rules import Check, Context

__all__ = ["backend_issues", "plan_size_issues", "validate"]


def validate(loaded: LoadedModel) -> list[Issue]:
    """Every rule violation in the model, sorted by path; empty when it compiles."""
    ctx = Context(loaded, resolve_nodes(loaded.model))
    issues: set[Issue] = set()
    for check in _CHECKS:
        issues.update(check(ctx))
    return sorted(issues)


_CHECKS: tuple[Check, ...] = (
    check_job,
    check_deployment,
    check_ids,
    check_parallelism,
    check_size,
    check_inputs,
    check_cycles,
    check_consumed,
    check_operators,
    check_sources,
    check_sinks,
    check_paths,
    check_semantics,
    check_partitioning,
)
