"""The code's shape (issue 34): small modules and functions, each cross-process record's keys in one module.

No module over MODULE_LINES lines and no function over FUNCTION_LINES outside declarative
manifests. What is still over is named in DEBT with the reason it is left: a listed item
that shrank under the limit fails the test too, so the list stays exactly the debt.
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
DEBT = {
    "operator/nopstream_operator/reconcile.py:reconcile_pods",  # pods of a run: decide and act still mixed
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


def test_modules_and_functions_stay_small_and_the_debt_is_named_exactly():
    over = _over_the_limits() - DECLARATIVE
    assert sorted(over - DEBT) == [], "over the limits and not named as debt"
    assert sorted(DEBT - over) == [], "named as debt but no longer over: remove it from DEBT"


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
