"""Every numeric field has a bound: a value past it is refused in one line naming the field.

Found by an adversary: a sliding window 1e9/1 took 8.7 GB in 30 s, a generator of a
million splits wrote 397,000 checkpoint files in a minute, `sizeMs: 2**70` overflowed
int64, `vocabulary: 0` divided by zero in every task (retried ten times), `count: -5`
ran and emitted nothing, `ratePerSecond: 0` never ended, `idleTimeoutMs: -1` was taken.
Each row is the exact issue `validate` reports (docs/validation.md lists the bounds).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nopstream.model.errors import ModelError
from nopstream.model.load import load_data
from nopstream.plan import validation

BASE: dict[str, Any] = {
    "jobId": "b",
    "model": {
        "sources": [
            {
                "id": "gen",
                "type": "generator",
                "config": {"count": 10},
                "watermark": {"timestampFn": "fns:ts"},
            }
        ],
        "operators": [
            {
                "id": "w",
                "type": "window",
                "inputs": ["gen"],
                "key": {"field": "k"},
                "aggregate": "count",
                "window": {"kind": "sliding", "time": "event", "sizeMs": 10, "slideMs": 5},
            }
        ],
        "sinks": [{"id": "out", "type": "stdout", "inputs": ["w"]}],
    },
    "semanticMode": "AT_LEAST_ONCE",
}


def issues(change: dict[str, Any]) -> list[str]:
    """The issues of BASE with `change` applied (dotted path -> value)."""
    model = copy.deepcopy(BASE)
    for dotted, value in change.items():
        *head, last = dotted.split(".")
        at: Any = model
        for part in head:
            at = at[int(part)] if part.isdigit() else at[part]
        at[last] = value
    try:
        return [str(i) for i in validation.validate(load_data(model))]
    except ModelError as err:
        return [str(i) for i in err.issues]


def test_the_base_job_is_valid():
    assert issues({}) == []


W = "model.operators[0].window"
G = "model.sources[0].config"
WM = "model.sources[0].watermark"


@pytest.mark.parametrize(
    ("change", "issue"),
    [
        (
            {"model.operators.0.window.sizeMs": 10**9, "model.operators.0.window.slideMs": 1},
            f"{W}.slideMs: puts each record in 1000000000 windows (sizeMs / slideMs), at most 1000"
            " (rule: bounds)",
        ),
        (
            {"model.operators.0.window.sizeMs": 2**70},
            f"{W}.sizeMs: must be at most 315,360,000,000, got 1,180,591,620,717,411,303,424 (rule: bounds)",
        ),
        (
            {"model.operators.0.window.allowedLatenessMs": 10**15},
            f"{W}.allowedLatenessMs: must be at most 315,360,000,000, got 1,000,000,000,000,000"
            " (rule: bounds)",
        ),
        (
            {"model.sources.0.watermark.idleTimeoutMs": -1},
            f"{WM}.idleTimeoutMs: must be at least 1, got -1 (rule: positive)",
        ),
        (
            {"model.sources.0.watermark.maxOutOfOrdernessMs": 10**12},
            f"{WM}.maxOutOfOrdernessMs: must be at most 315,360,000,000, got 1,000,000,000,000"
            " (rule: bounds)",
        ),
        (
            {"checkpoint": {"intervalMs": 10**9}},
            "checkpoint.intervalMs: must be at most 86,400,000, got 1,000,000,000 (rule: bounds)",
        ),
        (
            {"checkpoint": {"timeoutMs": 10**9}},
            "checkpoint.timeoutMs: must be at most 86,400,000, got 1,000,000,000 (rule: bounds)",
        ),
        (
            {"model.sources.0.config.splits": 1_000_000},
            f"{G}.splits: must be less than or equal to 1024 (rule: schema)",
        ),
        (
            {"model.sources.0.config.splits": -2},
            f"{G}.splits: must be greater than or equal to 1 (rule: schema)",
        ),
        (
            {"model.sources.0.config.count": -5},
            f"{G}.count: must be greater than or equal to 0 (rule: schema)",
        ),
        (
            {"model.sources.0.config.vocabulary": 0},
            f"{G}.vocabulary: must be greater than or equal to 1 (rule: schema)",
        ),
        ({"model.sources.0.config.keys": 0}, f"{G}.keys: must be greater than or equal to 1 (rule: schema)"),
        (
            {"model.sources.0.config.ratePerSecond": 0},
            f"{G}.ratePerSecond: must be greater than 0 (rule: schema)",
        ),
    ],
)
def test_a_value_past_its_bound_is_refused_naming_the_field(change, issue):
    assert issues(change) == [issue]
