"""What storage holds for a checkpoint namespace: durable epochs, verified reads, retention.

Storage is the truth: an epoch is durable exactly when its manifest exists and
verifies, and no later run superseded it, so recovery can find the latest durable
epoch by listing storage even when the epoch log is gone. Retention keeps the latest N
durable epochs and every savepoint, and removes orphans: objects of epochs without a
manifest (or superseded) that are older than the latest durable epoch (an epoch newer
than it may still be in flight).

Fencing: a run records, before its tasks restore, which epoch it restores and the first
epoch number it will use (`record_restore`: `_restores/{next}-after-{kept}`). Every
epoch numbered between the two belonged to an earlier run that this one abandons (its
sinks abort what those epochs staged), so a manifest of one of them is superseded,
never durable, whenever it lands: a deposed coordinator that resumes and writes the
manifest of the epoch it had in flight writes nothing a restore will ever read. A
check before the write could not do it: the writer may pause between the check and
the write.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nopstream.checkpoint.formats import (
    MANIFEST_NAME,
    Manifest,
    check_plan,
    decode_manifest,
    decode_segment,
    manifest_path,
)
from nopstream.checkpoint.storage import Storage
from nopstream.errors import RestoreRefused, StorageError

RESTORES = "_restores"
"""The folder of a namespace's restore records (`record_restore`)."""

_READERS = 8
"""Segments read at once by a restore: an object store answers each GET in its own round trip."""


@dataclass(frozen=True)
class Checkpoint:
    """A verified durable epoch: its manifest and every segment's payload by path."""

    epoch: int
    manifest: Manifest
    segments: dict[str, Any]


@dataclass(frozen=True)
class Stored:
    """What storage holds of a namespace, read in one listing: each epoch's object paths."""

    namespace: str
    epochs: dict[int, frozenset[str]]
    restores: frozenset[tuple[int, int]] = frozenset()
    """(the last epoch a run kept, its first epoch) of each restore record: the epochs between are
    superseded."""

    @classmethod
    def read(cls, storage: Storage, namespace: str) -> Stored:
        """List the namespace once."""
        prefix = f"checkpoint/{namespace}/"
        found: dict[int, set[str]] = {}
        restores = set()
        for path in storage.list(prefix):
            head, _, rest = path[len(prefix) :].partition("/")
            if head.isdigit():
                found.setdefault(int(head), set()).add(path)
            elif head == RESTORES and (record := _restore_of(rest)) is not None:
                restores.add(record)
        epochs = {epoch: frozenset(paths) for epoch, paths in found.items()}
        return cls(namespace, epochs, frozenset(restores))

    def superseded(self, epoch: int) -> tuple[int, int] | None:
        """The restore record of a run that abandoned `epoch` (numbered between the epoch it restored
        and its own first), or None."""
        return next((r for r in sorted(self.restores) if r[0] < epoch < r[1]), None)

    def durable(self) -> list[int]:
        """Epochs that have a manifest and were not superseded, oldest first (not yet verified)."""
        return sorted(
            e
            for e, paths in self.epochs.items()
            if manifest_path(self.namespace, e) in paths and self.superseded(e) is None
        )

    def check_not_superseded(self, epoch: int) -> None:
        """RestoreRefused when a later run abandoned `epoch` (its manifest came after that run began)."""
        record = self.superseded(epoch)
        if record is not None:
            raise RestoreRefused(
                f"epoch {epoch} was abandoned by a later run, which kept the epochs up to {record[0]} and"
                f" numbered its own from {record[1]}: its manifest came after that run began (a deposed"
                " coordinator's), and its sinks' transactions were aborted"
            )

    def latest_durable(self, *, since: int = 1) -> int | None:
        """The newest durable epoch (of epoch `since` or later), or None."""
        epochs = [e for e in self.durable() if e >= since]
        return epochs[-1] if epochs else None

    def highest(self) -> int | None:
        """The highest epoch number anything is kept under (durable or not), or None."""
        return max(self.epochs, default=None)

    def check_complete(self, manifest: Manifest) -> None:
        """RestoreRefused naming the first segment of the manifest that storage does not hold."""
        held = self.epochs.get(manifest.epoch, frozenset())
        for ref in manifest.segments():
            if ref.path not in held:
                raise _missing(ref.path, manifest.epoch)


def _restore_of(name: str) -> tuple[int, int] | None:
    """(kept, next) of a restore record's name `{next}-after-{kept}`; None for anything else."""
    first, sep, kept = name.partition("-after-")
    if not (sep and first.isdigit() and kept.isdigit()):
        return None
    return int(kept), int(first)


def restore_path(namespace: str, kept: int, next_epoch: int) -> str:
    """Where the record of a run that kept the epochs up to `kept` and numbers from `next_epoch` is."""
    return f"checkpoint/{namespace}/{RESTORES}/{next_epoch:012d}-after-{kept:012d}"


def record_restore(
    storage: Storage, namespace: str, *, restored: int | None, floor: int, next_epoch: int
) -> None:
    """Before a run's tasks restore: record that it restores `restored` (None: nothing, its lineage's
    epochs beginning after `floor`) and numbers its own from `next_epoch`, so that every epoch between
    is superseded; nothing is recorded when there is none (no epoch was in flight)."""
    kept = max(restored or 0, floor)
    if kept + 1 >= next_epoch:
        return
    body = {"restored": restored, "nextEpoch": next_epoch, "supersedes": [kept + 1, next_epoch - 1]}
    storage.put(restore_path(namespace, kept, next_epoch), json.dumps(body, sort_keys=True).encode())


def durable_epochs(storage: Storage, namespace: str) -> list[int]:
    """Epochs that have a manifest and were not superseded, oldest first (not yet verified)."""
    return Stored.read(storage, namespace).durable()


def _missing(path: str, epoch: int) -> RestoreRefused:
    return RestoreRefused(f"segment {path} of epoch {epoch} is missing")


def read_manifest(storage: Storage, namespace: str, epoch: int) -> Manifest:
    """An epoch's verified manifest; RestoreRefused when missing or damaged."""
    path = manifest_path(namespace, epoch)
    try:
        data = storage.get(path)
    except StorageError:
        raise RestoreRefused(f"epoch {epoch} has no manifest at {storage.describe()}/{path}") from None
    return decode_manifest(data, path=path, epoch=epoch)


def load_checkpoint(
    storage: Storage,
    namespace: str,
    epoch: int,
    *,
    plan_fingerprint: str,
    select: Callable[[str], bool] | None = None,
) -> Checkpoint:
    """Read and verify an epoch: its manifest, the plan it was taken with, every segment (or those
    whose path `select` takes: one task's part)."""
    manifest = read_manifest(storage, namespace, epoch)
    check_plan(manifest, fingerprint=plan_fingerprint, epoch=epoch)
    refs = [ref for ref in manifest.segments() if select is None or select(ref.path)]

    def fetch(path: str) -> bytes:
        try:
            return storage.get(path)
        except StorageError:
            raise _missing(path, epoch) from None

    segments: dict[str, Any] = {}
    # read side by side, verified in the manifest's order: the same first refusal as one by one
    with ThreadPoolExecutor(max_workers=max(1, min(_READERS, len(refs)))) as pool:
        for ref, data in zip(refs, pool.map(fetch, [r.path for r in refs]), strict=True):
            _, payload = decode_segment(data, path=ref.path, epoch=epoch, ref=ref)
            segments[ref.path] = payload
    return Checkpoint(epoch, manifest, segments)


def apply_retention(storage: Storage, namespace: str, *, keep: int) -> list[str]:
    """Delete what retention lets go; returns the deleted paths.

    Kept: the latest `keep` durable epochs, every savepoint, and every epoch newer
    than the latest durable one (in flight). Deleted: older durable epochs, and
    orphans (objects of older epochs that never got a manifest).
    """
    stored = Stored.read(storage, namespace)
    durable = stored.durable()
    if not durable:
        return []
    kept = set(durable[-keep:]) if keep > 0 else set()
    for epoch in durable:
        if epoch not in kept and read_manifest(storage, namespace, epoch).kind.is_savepoint:
            kept.add(epoch)
    newest = durable[-1]
    deleted = []
    for epoch, paths in sorted(stored.epochs.items()):
        if epoch in kept or epoch > newest:
            continue
        # the manifest goes first, so a crash mid-way never leaves a manifest without segments
        for path in sorted(paths, key=lambda p: not p.endswith(MANIFEST_NAME)):
            storage.delete(path)
            deleted.append(path)
    # a record whose epochs are all older than the latest kept: a manifest of one of them, however
    # late, is older than an epoch kept, so never restored, and the next retention deletes it
    oldest_latest = durable[-keep] if 0 < keep <= len(durable) else None
    for kept_up_to, next_epoch in sorted(stored.restores):
        if oldest_latest is not None and next_epoch <= oldest_latest:
            storage.delete(restore_path(namespace, kept_up_to, next_epoch))
            deleted.append(restore_path(namespace, kept_up_to, next_epoch))
    return deleted
