"""The code's shape (issue 34): small modules and functions, each cross-process record's keys in one module.

No module over MODULE_LINES lines and no function over FUNCTION_LINES outside the
declarative manifests named in DECLARATIVE, each with why it is one piece.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

MODULE_LINES = 500
FUNCTION_LINES = 60
DECLARATIVE = {
    "nopstream/cli/arguments.py:parser",  # every command's arguments, one add_argument each
    "nopstream/model/crd.py:streamjob_crd",  # the CRD's schema
    "operator/nopstream_operator/resources.py:_pod",  # a pod manifest
}


def _sources() -> list[Path]:
    return sorted(
        [*(ROOT / "nopstream").rglob("*.py"), *(ROOT / "operator" / "nopstream_operator").rglob("*.py")]
    )


def _over_the_limits() -> set[str]:
    over = set()
    for path in _sources():
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            over.add(name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _lines(node) > FUNCTION_LINES:
                over.add(f"{name}:{node.name}")
    return over


def _lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_modules_and_functions_stay_small():
    assert sorted(_over_the_limits() - DECLARATIVE) == []


KEYS = {
    # a quoted key of a cross-process record: the only module that may write or read it
    '"pending"': "nopstream/records.py",  # SinkState
    '"detail"': "nopstream/cluster/epochlog.py",  # EpochEntry
    '"candidate"': "nopstream/cluster/election.py",  # LeaderKey
    **{
        f'"NOPSTREAM_{name}"': "nopstream/node/settings.py"  # NodeEnv and from_env
        for name in (
            "PLAN_DIR",
            "ATTEMPT",
            "TASK_ID",
            "RUN",
            "STANDBY",
            "ADVERTISE",
            "LEASE_TTL",
            "PARENT_PID",
        )
    },
}


def test_each_cross_process_records_keys_are_read_in_its_module_only():
    found = {
        (key, path.relative_to(ROOT).as_posix())
        for path in _sources()
        for key in KEYS
        if re.search(re.escape(key), path.read_text())
    }
    assert sorted(found) == sorted(KEYS.items())
