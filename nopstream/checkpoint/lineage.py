"""A checkpoint namespace's lineage: which of its epochs belong to the job as it runs now.

A job starts in lineage 1. Starting over (`nopstream run --fresh`, a new
`spec.restartNonce`) starts lineage N+1 from nothing; `--restore-from E` starts it
from durable epoch E. Its record `checkpoint/{ns}/_lineage.json` names the first
epoch number that belongs to it, past every epoch in storage, and its base epoch:
the lineage restores its own latest durable epoch, or the base while it has none.
No other epoch of an older lineage is ever restored again, and epoch numbers never
repeat.
Committed sink output carries the lineage in its names, so a new lineage never
overwrites what an older one published.
WARNING: write a new lineage only while holding the namespace (`local.ownership`), or as
the leading coordinator of the job on etcd (`node.coordinator`).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

from nopstream.checkpoint import catalog
from nopstream.checkpoint.storage import Storage
from nopstream.errors import RestoreRefused, StorageError

LINEAGE_NAME = "_lineage.json"


@dataclass(frozen=True)
class Lineage:
    """The lineage a checkpoint namespace runs now."""

    number: int = 1
    first_epoch: int = 1
    base: int | None = None
    nonce: str | None = None
    started_at: str | None = None

    def to_json(self) -> bytes:
        """Canonical JSON."""
        body = {
            "lineage": self.number,
            "firstEpoch": self.first_epoch,
            "base": self.base,
            "nonce": self.nonce,
        }
        return json.dumps({**body, "startedAt": self.started_at}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, *, path: str) -> Lineage:
        """Parse a lineage record; RestoreRefused naming the path when it is damaged."""
        try:
            raw: dict[str, Any] = json.loads(data)
            base = None if raw.get("base") is None else int(raw["base"])
            return cls(
                int(raw["lineage"]), int(raw["firstEpoch"]), base, raw.get("nonce"), raw.get("startedAt")
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise RestoreRefused(f"lineage record {path} is damaged ({exc})") from None


def lineage_path(namespace: str) -> str:
    """Where a namespace's lineage record is."""
    return f"checkpoint/{namespace}/{LINEAGE_NAME}"


def current(storage: Storage, namespace: str) -> Lineage:
    """The namespace's lineage (1 when none was ever started over)."""
    path = lineage_path(namespace)
    try:
        return Lineage.from_json(storage.get(path), path=path)
    except StorageError:
        if storage.exists(path):
            raise
        return Lineage()


def start_over(storage: Storage, namespace: str, *, nonce: str, base: int | None = None) -> Lineage | None:
    """Lineage N+1 past every epoch in storage, from epoch `base` (None: from nothing), not yet
    recorded; None when `nonce` started the current lineage already (a recovery of its run).

    The caller verifies what the lineage would restore, then `record`s it: a refused
    start leaves the namespace's lineage as it was.
    """
    now = current(storage, namespace)
    if now.nonce == nonce:
        return None
    stored = catalog.Stored.read(storage, namespace)
    if base is not None:
        catalog.read_manifest(storage, namespace, base)  # RestoreRefused when it is not durable
        stored.check_not_superseded(base)
    highest = stored.highest()
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    if highest is None and now == Lineage():  # nothing to start over from: the first lineage, with the nonce
        return Lineage(1, 1, None, nonce, started)
    return Lineage(now.number + 1, max(highest or 0, now.first_epoch - 1) + 1, base, nonce, started)


def record(storage: Storage, namespace: str, line: Lineage) -> None:
    """Make `line` the namespace's lineage (after what it restores was verified)."""
    storage.put(lineage_path(namespace), line.to_json())
