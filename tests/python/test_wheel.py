"""`pip install` of nopstream's built wheel into a fresh virtualenv, on every Python 3.11-3.13 this
machine has: the CLI, the builder and `Job.run`, the operator extra and the dashboard's files work.

The wheelhouses (the runtime lock's wheels for each Python) are made once by
`scripts/install-servers.sh wheels`; the installs here are offline, from them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT

CACHE = Path(os.environ.get("NOPSTREAM_CACHE", Path.home() / ".cache" / "nopstream"))
LOCK_HASH = hashlib.sha256((ROOT / "runtime-image" / "requirements.lock").read_bytes()).hexdigest()[:16]
HOUSES = sorted(CACHE.glob(f"wheelhouse-3.*-{LOCK_HASH}"), key=lambda p: int(p.name.split("-")[1][2:]))


def run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """nopstream's wheel, built from a copy of the sources (the checkout gets no build files)."""
    assert HOUSES, "no wheelhouse: run scripts/install-servers.sh wheels"
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "nopstream", src / "nopstream", ignore=ignore)
    shutil.copytree(
        ROOT / "operator" / "nopstream_operator", src / "operator" / "nopstream_operator", ignore=ignore
    )
    python = (HOUSES[0] / "python").read_text().strip()
    out = tmp_path_factory.mktemp("dist")
    run(
        python,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-index",
        "--find-links",
        HOUSES[0],
        "-w",
        out,
        src,
        cwd=src,
    )
    (found,) = out.glob("nopstream-*.whl")
    return found


SCRIPT = """
from nopstream import Job, testing
import wordcount

job = Job("py", checkpoint={"storage": {"local": {"path": "py-cp"}}})
words = testing.source(job, "lines", ["a b", "b"]).flat_map(wordcount.split, id="split")
counts = words.key_by(fn=wordcount.word).aggregate("count", id="count", emit="final")
out = testing.collect(counts, "out", path="py-out")
job.run()
print(sorted((r["key"], r["value"]) for r in out.records))
"""


@pytest.mark.parametrize("house", HOUSES, ids=[h.name.split("-")[1] for h in HOUSES])
def test_the_wheel_installs_and_runs_an_example_on_this_python(wheel, house, tmp_path):
    python = (house / "python").read_text().strip()
    venv = tmp_path / "venv"
    run(python, "-m", "venv", venv, cwd=tmp_path)
    run(
        venv / "bin" / "pip",
        "install",
        "-q",
        # the modules the checks import are compiled as they load: compiling every installed module
        # (the Kubernetes client's thousands) took half of each install
        "--no-compile",
        "--no-index",
        "--find-links",
        house,
        f"{wheel}[operator]",
        cwd=tmp_path,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONPYCACHEPREFIX")}
    assert "run a job on this machine" in run(venv / "bin" / "nopstream", "--help", cwd=tmp_path, env=env)
    shutil.copytree(EXAMPLES / "data" / "wordcount", tmp_path / "examples" / "data" / "wordcount")
    shutil.copy(EXAMPLES / "wordcount.yaml", tmp_path)
    shutil.copy(EXAMPLES / "wordcount.py", tmp_path)
    run(venv / "bin" / "nopstream", "run", "wordcount.yaml", "--quiet", cwd=tmp_path, env=env)
    words = Counter(
        w
        for f in sorted((tmp_path / "examples/data/wordcount").iterdir())
        for w in f.read_text().lower().split()
    )
    import json

    counted = {
        r["key"]: r["value"]
        for f in (tmp_path / "out" / "wordcount").glob("*.jsonl")
        for r in map(json.loads, f.read_text().splitlines())
    }
    assert counted == dict(words)
    (tmp_path / "script.py").write_text(SCRIPT)
    assert (
        run(venv / "bin" / "python", "script.py", cwd=tmp_path, env=env)
        .strip()
        .endswith("[('a', 1), ('b', 2)]")
    )
    check = (
        "import importlib.resources, nopstream_operator.handlers, kopf, sys;"
        "d = importlib.resources.files('nopstream') / 'node' / 'view' / 'dashboard';"
        "print(sys.version_info[:2], sorted(p.name for p in d.iterdir() if p.suffix in ('.html', '.js')))"
    )
    printed = run(venv / "bin" / "python", "-c", check, cwd=tmp_path, env=env)
    version = house.name.split("-")[1]
    assert printed.startswith(f"({version.replace('.', ', ')})"), printed
    assert "index.html" in printed, printed
    assert sys.version_info >= (3, 11)
