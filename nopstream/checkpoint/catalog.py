"""What storage holds for a checkpoint namespace: durable epochs, verified reads, retention.

Storage is the truth: an epoch is durable exactly when its manifest exists and
verifies, so recovery can find the latest durable epoch by listing storage even when
the epoch log is gone. Retention keeps the latest N durable epochs and every
savepoint, and removes orphans: objects of epochs without a manifest that are older
than the latest durable epoch (an epoch newer than it may still be in flight).
"""

from __future__ import annotations

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

    @classmethod
    def read(cls, storage: Storage, namespace: str) -> Stored:
        """List the namespace once."""
        prefix = f"checkpoint/{namespace}/"
        found: dict[int, set[str]] = {}
        for path in storage.list(prefix):
            head = path[len(prefix) :].split("/", 1)[0]
            if head.isdigit():
                found.setdefault(int(head), set()).add(path)
        return cls(namespace, {epoch: frozenset(paths) for epoch, paths in found.items()})

    def durable(self) -> list[int]:
        """Epochs that have a manifest, oldest first (not yet verified)."""
        return sorted(e for e, paths in self.epochs.items() if manifest_path(self.namespace, e) in paths)

    def latest_durable(self, *, since: int = 1) -> int | None:
        """The newest epoch with a manifest (of epoch `since` or later), or None."""
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


def durable_epochs(storage: Storage, namespace: str) -> list[int]:
    """Epochs that have a manifest, oldest first (not yet verified)."""
    return Stored.read(storage, namespace).durable()


def highest_epoch(storage: Storage, namespace: str) -> int | None:
    """The highest epoch number anything in storage is kept under (durable or not), or None."""
    return Stored.read(storage, namespace).highest()


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
    return deleted
