"""What the benchmarks share: a job file written from its spec, and one run of it timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nopstream.local import runner
from nopstream.model.load import load_file
from nopstream.plan import compiler


def write_job(workdir: Path, name: str, spec: dict[str, Any]) -> Path:
    """`spec` (a job: `jobId`, settings, `model`) as `{workdir}/{name}.yaml`; its path."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def processing_seconds(workdir: Path, path: Path) -> float:
    """Processing seconds of one run of the job at `path` in task processes (the local runner), with
    `workdir` on their PYTHONPATH for the job's functions."""
    plans = compiler.compile_model(load_file(path), backend="local")
    options = runner.RunOptions(quiet=True, workdir=workdir / ".nopstream", python_path=(str(workdir),))
    return runner.run_job(plans, options).processing_seconds
