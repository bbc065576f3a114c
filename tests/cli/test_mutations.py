"""Random mutations of the example jobs: `validate` and `run --in-process` never give a traceback,
never hang, and write nothing outside the job's own directory.

A mutation replaces one field of an example anywhere in its tree with a value a
careless or hostile user might give (a bool, a huge or negative number, an empty or
escaping path, a wrong type), or deletes it. Seeded (hypothesis, derandomized).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nopstream import cli
from tests.conftest import EXAMPLES, ROOT, run_nopstream

JOBS = ["wordcount.yaml", "windowed.yaml", "fraud.yaml", "enrichment.yaml", "rules.yaml"]
VALUES = [True, False, -1, 0, 10**12, 2.5, "", "../../x", "/etc", "x" * 300, [], {}, None, [[[[1]]]], "a:b"]
DELETE = object()


def paths(value: Any, at: tuple = ()) -> list[tuple]:
    """Every path into the tree of a parsed job."""
    out = [at] if at else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += paths(item, (*at, i))
    return out


def mutate(tree: Any, path: tuple, value: Any) -> Any:
    parent = tree
    for part in path[:-1]:
        parent = parent[part]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return tree


@st.composite
def mutated(draw) -> tuple[str, dict]:
    name = draw(st.sampled_from(JOBS))
    tree = yaml.safe_load((EXAMPLES / name).read_text())
    path = draw(st.sampled_from(paths(tree)))
    return name, mutate(tree, path, draw(st.sampled_from([*VALUES, DELETE])))


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=mutated())
def test_validate_of_a_mutated_example_says_what_is_wrong_or_accepts_it(case, tmp_path, capsys):
    name, tree = case
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree))
    code = cli.main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert code in (0, 1), (tree, out, err)
    assert "Traceback" not in out + err and "internal error" not in err
    assert (code == 1) == err.startswith("invalid: "), err


@settings(
    max_examples=12,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=mutated())
def test_run_of_a_mutated_example_fails_cleanly_or_runs(case, tmp_path_factory):
    name, tree = case
    home = tmp_path_factory.mktemp("mutated")
    shutil.copytree(EXAMPLES, home / "examples")
    (home / "examples" / name).write_text(yaml.safe_dump(tree))
    before = _tree(ROOT)
    try:
        result = run_nopstream("run", f"examples/{name}", "--in-process", "--quiet", cwd=home, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"run of {tree} did not end within 60 s") from None
    assert result.code in (0, 1, 3), (tree, result)
    assert "Traceback" not in result.err and "internal error" not in result.err, (tree, result.err)
    assert _tree(ROOT) == before  # nothing written into the checkout (the examples' usual paths)


# What other tests write into the checkout while this one runs (another xdist worker): caches,
# hypothesis's own directory, the workdir of runs started in the checkout, screenshots.
_NOT_WRITTEN_BY_A_RUN = frozenset({"__pycache__", ".git", ".nopstream", ".hypothesis", "test-artifacts"})


def _tree(root: Path) -> list[str]:
    """The files of the checkout but for caches and other test processes' writes."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and _NOT_WRITTEN_BY_A_RUN.isdisjoint(p.relative_to(root).parts)
    )
