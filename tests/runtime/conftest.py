"""Helpers for runtime tests: run a job through `nopstream run` and read what its sinks wrote."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from nopstream.connectors.stripes import STRIPE_BYTES
from tests.conftest import EXAMPLES, run_nopstream

MIN_TIMESTAMP = -(2**63)

MODES = ["processes", "in-process"]


def multiset(records: list[Any]) -> Counter[str]:
    """Records as a multiset (each as canonical JSON)."""
    return Counter(json.dumps(r, sort_keys=True) for r in records)


def write_jsonl(path: Path, records: list[Any]) -> None:
    """Write records as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def run_job(
    workdir: Path,
    model: dict[str, Any],
    *,
    mode: str,
    fns: str = "",
    inputs: dict[str, list[Any]] | None = None,
    expect_code: int = 0,
    **job: Any,
) -> dict[str, list[Any]]:
    """Write inputs, user functions (module `jobfns`) and the job; run it; return each sink's records."""
    write_job(workdir, model, fns=fns, inputs=inputs, **job)
    args = ["run", "job.yaml", "--quiet"] + (["--in-process"] if mode == "in-process" else [])
    result = run_nopstream(*args, cwd=workdir)
    assert result.code == expect_code, f"exit {result.code}\n{result.err}"
    return {sink["id"]: read_outputs(workdir / sink["config"]["path"]) for sink in model["sinks"]}


def write_job(
    workdir: Path,
    model: dict[str, Any],
    *,
    fns: str = "",
    inputs: dict[str, list[Any]] | None = None,
    **job: Any,
) -> None:
    """Write inputs, user functions (module `jobfns`) and the job (`job.yaml`, id `test`) into `workdir`."""
    for name, records in (inputs or {}).items():
        write_jsonl(workdir / "in" / name, records)
    (workdir / "jobfns.py").write_text(textwrap.dedent(fns))
    spec = {"jobId": "test", "semanticMode": "STRICT_EXACTLY_ONCE", **job, "model": model}
    (workdir / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def read_outputs(directory: Path) -> list[Any]:
    """The records of every committed JSON-lines file of a file sink's directory."""
    records: list[Any] = []
    for f in sorted(directory.glob("*.jsonl")) if directory.exists() else []:
        records.extend(json.loads(line) for line in f.read_text().splitlines() if line)
    return records


@pytest.fixture(params=MODES)
def mode(request):
    """Each runtime test runs multi-process and in-process."""
    return request.param


def run_example(workdir: Path, name: str, *, parallelism: int, mode: str) -> Path:
    """Run `examples/NAME.yaml` at `parallelism` from a copy in `workdir`; the copy of its data directory."""
    data = workdir / "examples" / "data" / name
    shutil.copytree(EXAMPLES / "data" / name, data)
    shutil.copy(EXAMPLES / f"{name}.py", workdir / "examples")
    job = (
        (EXAMPLES / f"{name}.yaml")
        .read_text()
        .replace("  parallelism: 2\n", f"  parallelism: {parallelism}\n", 1)
    )
    (workdir / "examples" / f"{name}.yaml").write_text(job)
    args = ["run", f"examples/{name}.yaml", "--quiet"] + (["--in-process"] if mode == "in-process" else [])
    result = run_nopstream(*args, cwd=workdir)
    assert result.code == 0, result.err
    return data


def marked_stripes(path: Path, delay: int) -> list[tuple[dict[str, Any], int]]:
    """Each record of a JSON-lines file with its mark: its stripe's highest timestamp so far - `delay` - 1."""
    tops: dict[int, int] = {}
    out, offset = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        record, stripe = json.loads(line), offset // STRIPE_BYTES
        top = tops.get(stripe, MIN_TIMESTAMP)
        out.append((record, MIN_TIMESTAMP if top == MIN_TIMESTAMP else top - delay - 1))
        tops[stripe] = max(top, record["ts"])
        offset += len(line)
    return out
