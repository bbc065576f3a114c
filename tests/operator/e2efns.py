"""The user functions of the e2e jobs: on PYTHONPATH of the job pods (and in the e2e image)."""

import os
import time

SLOW = not os.environ.get("E2E_FAILURE_FREE")
"""Whether the functions that make a job last take their time: not in the failure-free run on the
embedded default (`test_e2e.CleanRun`), which only has to end."""


def split(line: str) -> list[str]:
    """Words of a line, slowly (3 ms a line), so a job lasts long enough to be hurt."""
    if SLOW:
        time.sleep(0.003)
    return line.split()


def word(w: str) -> str:
    """The word itself: the key of the word count."""
    return w


def first_letter(w: str) -> str:
    """A different key selector (a change the compatibility check refuses)."""
    return w[:1]


def explode(line: str) -> list[str]:
    """A function that always fails: its task fails in every run."""
    raise ValueError(f"cannot split {line[:20]!r}")


def pace(record: dict) -> dict:
    """The record itself, after 5 ms: the enrichment job lasts long enough for its pods to be killed."""
    if SLOW:
        time.sleep(0.005)
    return record
