"""Helpers for plan tests: compile models given as plain data or files."""

from __future__ import annotations

from typing import Any

from nopstream.model.load import load_data, load_file
from nopstream.plan import compiler
from tests.conftest import EXAMPLES


def compile_data(data: dict[str, Any], **kwargs: Any) -> compiler.CompiledPlans:
    """Compile a bare model given as plain data."""
    return compiler.compile_model(load_data(data), **kwargs)


def compile_example(name: str) -> compiler.CompiledPlans:
    """Compile one of the examples/ manifests."""
    return compiler.compile_model(load_file(EXAMPLES / f"{name}.yaml"))


def linear(*operators: dict[str, Any], parallelism: int = 2, **job: Any) -> dict[str, Any]:
    """A bare model: generator source -> operators (in order) -> file sink."""
    return {
        "jobId": "job",
        "parallelism": parallelism,
        **job,
        "model": {
            "sources": [{"id": "src", "type": "generator", "config": {"count": 10}}],
            "operators": list(operators),
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
