"""Where a run starts: the restore point, chosen from storage by one function for every start.

Every start of a run (a first run, a global recovery, `nopstream run` again, a new pod
generation) begins here. Storage is the truth: the restore point is the latest durable
epoch of the namespace's current lineage, or the lineage's base epoch while it has none
(`--restore-from` starts a lineage from an older epoch): its manifest verified, its plan
checked, and every segment it names present in one listing of storage. The segments'
contents are verified by the tasks that read them (`load`, each task its own part): a
damaged one refuses the run there, naming it, before the task's state is used. A
record elsewhere that shows a later durable epoch (the etcd epoch log) while its
manifest is missing refuses the restore, naming the manifest, instead of silently going
back to an older epoch. The first epoch number of the run is past every epoch in
storage and in the log: numbers never repeat, so no transaction or committed output of
an earlier attempt is ever named again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nopstream.checkpoint import catalog, lineage
from nopstream.checkpoint.formats import check_plan, manifest_path
from nopstream.checkpoint.storage import Storage
from nopstream.errors import RestoreRefused
from nopstream.plan.canonical import fingerprint
from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import PartitionedPlan


@dataclass(frozen=True)
class NewLineage:
    """Start over in a new lineage (once per nonce), from durable epoch `base` or from nothing."""

    nonce: str
    base: int | None = None


@dataclass(frozen=True)
class RestorePoint:
    """The epoch a run restores (None: nothing), its lineage, and the run's first epoch number.

    `from_plan`: the fingerprint of the plan the epoch was taken with, when it is
    another plan (a rescale or upgrade from a stop savepoint).
    """

    epoch: int | None
    kind: EpochKind | None
    lineage: int
    next_epoch: int
    from_plan: str | None = None

    @property
    def finished(self) -> bool:
        """Whether the restored epoch is the job's final one: the job is over."""
        return self.kind == EpochKind.FINAL

    def to_json(self) -> bytes:
        """Canonical JSON (the run's restore point in etcd, a worker's settings)."""
        body = {
            "epoch": self.epoch,
            "kind": self.kind,
            "lineage": self.lineage,
            "nextEpoch": self.next_epoch,
            "fromPlan": self.from_plan,
        }
        return json.dumps(body, sort_keys=True).encode()

    @staticmethod
    def refusal_json(reason: str) -> bytes:
        """What the run's coordinator records instead of a point when the run cannot start."""
        return json.dumps({"refused": reason}).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> RestorePoint:
        """Parse `to_json`'s output; RestoreRefused with the reason `refusal_json` recorded."""
        raw: dict[str, Any] = json.loads(data)
        if "refused" in raw:
            raise RestoreRefused(str(raw["refused"]))
        epoch = None if raw["epoch"] is None else int(raw["epoch"])
        kind = None if raw["kind"] is None else EpochKind(raw["kind"])
        return cls(epoch, kind, int(raw["lineage"]), int(raw["nextEpoch"]), raw.get("fromPlan"))


@dataclass(frozen=True)
class RestoreRequest:
    """What a run's coordinator is asked before it chooses the run's restore point.

    The operator or `nopstream run --etcd` writes it before the run starts: a new
    lineage (`spec.restartNonce`, `--fresh`, `--restore-from`), or the plan a stop
    savepoint was taken with (an upgrade or rescale). The coordinator alone writes the
    point, fenced.
    """

    new_lineage: NewLineage | None = None
    from_plan: str | None = None

    def to_json(self) -> bytes:
        """Canonical JSON (`runs/{run}/restore-request` in etcd)."""
        fresh = self.new_lineage
        body = {
            "restartNonce": fresh.nonce if fresh else None,
            "base": fresh.base if fresh else None,
            "fromPlan": self.from_plan,
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> RestoreRequest:
        """Parse `to_json`'s output."""
        raw: dict[str, Any] = json.loads(data)
        nonce, base = raw.get("restartNonce"), raw.get("base")
        fresh = NewLineage(str(nonce), None if base is None else int(base)) if nonce else None
        return cls(fresh, raw.get("fromPlan"))


def choose(
    storage: Storage,
    plan: PartitionedPlan,
    *,
    new_lineage: NewLineage | None = None,
    from_plan: str | None = None,
    log_latest: int | None = None,
    log_highest: int = 0,
    stored: catalog.Stored | None = None,
) -> RestorePoint:
    """The verified restore point of a run of `plan`; RestoreRefused when it cannot be restored.

    The latest durable epoch of the namespace's lineage, or the lineage's base while
    it has none. `new_lineage`: start over (`--fresh`, `--restore-from`, a restart
    nonce), recorded only once its base epoch is verified whole (every segment read):
    a refused start leaves the lineage as it was. `from_plan`: the plan the epoch was
    taken with (an upgrade the operator accepted); without it, a latest epoch taken
    with another plan is restored only when it is a stop savepoint.
    `log_latest`/`log_highest`: the latest durable and the highest epoch an epoch log
    records (etcd); a durable epoch there whose manifest storage lacks refuses the
    restore. `stored`: the namespace's listing when the caller has just read it (one
    listing, not two).
    """
    namespace = plan.identity.checkpoint_namespace
    starting = None
    if new_lineage is not None:
        starting = lineage.start_over(storage, namespace, nonce=new_lineage.nonce, base=new_lineage.base)
    line = starting or lineage.current(storage, namespace)
    if stored is None:
        stored = catalog.Stored.read(storage, namespace)
    chosen = stored.latest_durable(since=line.first_epoch)
    if log_latest is not None and log_latest >= line.first_epoch and log_latest > (chosen or 0):
        raise RestoreRefused(
            f"epoch {log_latest} is durable in the epoch log but its manifest"
            f" {storage.describe()}/{manifest_path(namespace, log_latest)} is missing or damaged;"
            f" the latest manifest found is of epoch {chosen if chosen is not None else 'none'}"
            " (restore an older epoch explicitly with --restore-from)"
        )
    if chosen is None:
        chosen = line.base
    kind = None
    if chosen is not None:
        manifest = catalog.read_manifest(storage, namespace, chosen)
        kind, taken_with = manifest.kind, manifest.plan_fingerprint
        if from_plan is None and kind == EpochKind.STOP and taken_with != fingerprint(plan):
            from_plan = str(taken_with)
        check_plan(manifest, fingerprint=from_plan or fingerprint(plan), epoch=chosen)
        stored.check_complete(manifest)
        if starting is not None:  # a new lineage is recorded only over an epoch whose every segment is sound
            catalog.load_checkpoint(
                storage, namespace, chosen, plan_fingerprint=from_plan or fingerprint(plan)
            )
    if starting is not None:
        lineage.record(storage, namespace, starting)
    highest = max(stored.highest() or 0, log_highest, chosen or 0, line.first_epoch - 1)
    # before any task restores (and its sinks abort what later epochs staged): the epochs in between
    # are this run's to abandon, whatever manifest of theirs lands later
    floor = line.first_epoch - 1
    catalog.record_restore(storage, namespace, restored=chosen, floor=floor, next_epoch=highest + 1)
    return RestorePoint(chosen, kind, line.number, highest + 1, from_plan=from_plan)


def load(
    storage: Storage,
    plan: PartitionedPlan,
    point: RestorePoint,
    *,
    select: Callable[[str], bool] | None = None,
) -> catalog.Checkpoint | None:
    """The verified checkpoint of a restore point, or its segments `select` takes (None when it
    restores nothing)."""
    if point.epoch is None:
        return None
    return catalog.load_checkpoint(
        storage,
        plan.identity.checkpoint_namespace,
        point.epoch,
        plan_fingerprint=point.from_plan or fingerprint(plan),
        select=select,
    )


def rescaled(plan: PartitionedPlan, point: RestorePoint) -> bool:
    """Whether the point's epoch was taken with another plan (a rescale or upgrade from a savepoint)."""
    return point.from_plan is not None and point.from_plan != fingerprint(plan)
