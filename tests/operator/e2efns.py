"""The user functions of the e2e jobs: on PYTHONPATH of the job pods (and in the e2e image)."""

import contextlib
import os
import threading
import time
from pathlib import Path

SLOW = not os.environ.get("E2E_FAILURE_FREE")
"""Whether the functions that make a job last take their time: not in the failure-free run on the
embedded default (`test_e2e.CleanRun`), which only has to end."""
RELEASE = "release"
"""The object of the job's S3 source bucket that ends the pacing: a test writes it once its faults
are done (`test_e2e.release`), so the job ends at full speed instead of outlasting its faults by
minutes. A job that reads no S3 source is paced to its end."""

_released = threading.Event()
_watcher: int | None = None
"""The process whose thread looks for RELEASE (a forked task process starts its own)."""


def _paced() -> bool:
    """Whether this process still takes its time: SLOW, until RELEASE is seen."""
    global _watcher
    if not SLOW or _released.is_set():
        return False
    if _watcher != os.getpid():
        _watcher = os.getpid()
        threading.Thread(target=_watch_for_release, name="e2e-release", daemon=True).start()
    return True


def _watch_for_release() -> None:
    """Look for RELEASE in the bucket of the job's S3 source once a second (a pod cut from MinIO
    only looks again later); set `_released` once it is there."""
    from nopstream.node.settings import PARTITIONED_FILE
    from nopstream.plan import compiler
    from nopstream.s3 import S3Storage

    plan = compiler.load_document((Path(os.environ["NOPSTREAM_PLAN_DIR"]) / PARTITIONED_FILE).read_text())
    configs = [
        n.spec["config"] for v in plan.vertices for n in v.operators if n.type == "s3" and n.kind == "source"
    ]
    if not configs:
        return
    storage = S3Storage.connect(configs[0]["endpoint"], configs[0]["bucket"])
    while not _released.is_set():
        with contextlib.suppress(Exception):  # unreachable for now: paced, as before
            if storage.exists(RELEASE):
                _released.set()
        time.sleep(1.0)


def split(line: str) -> list[str]:
    """Words of a line, slowly (3 ms a line) until released, so a job lasts long enough to be hurt."""
    if _paced():
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
    """The record itself, after 5 ms until released: the enrichment job lasts long enough for its
    pods to be killed."""
    if _paced():
        time.sleep(0.005)
    return record
