"""Shared helpers: the repository root and the `nopstream` command as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Result:
    """What one run of the command gave."""

    code: int
    out: str
    err: str


def run_nopstream(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Result:
    """Run `nopstream ARGS` as its own OS process (the console script of the venv)."""
    exe = Path(sys.executable).with_name("nopstream")
    proc = subprocess.run(
        [str(exe), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def nopstream():
    """The command runner, as a fixture."""
    return run_nopstream
