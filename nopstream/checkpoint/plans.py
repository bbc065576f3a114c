"""The plans a namespace's epochs were taken with, kept beside them, and the check of a changed plan.

`nopstream run` records the partitioned plan its epochs are taken with under
`checkpoint/{namespace}/plans/{fingerprint}.json` (once per plan: the same fingerprint
is the same document). A run of a changed job finds the plan its stop savepoint was
taken with there and classifies the change with the operator's own rules
(`plan.compat`): RESCALE and UPGRADE restore, REFUSED is refused with the reasons.
"""

from __future__ import annotations

from collections.abc import Iterable

from nopstream.checkpoint.restore import RestorePoint
from nopstream.checkpoint.storage import Storage
from nopstream.errors import RestoreRefused
from nopstream.plan import compat, compiler
from nopstream.plan.canonical import fingerprint
from nopstream.plan.partitioned import PartitionedPlan


def plan_path(namespace: str, plan_fingerprint: str) -> str:
    """The key of a plan document in its namespace."""
    return f"checkpoint/{namespace}/plans/{plan_fingerprint.removeprefix('sha256:')}.json"


def record(storage: Storage, plan: PartitionedPlan) -> None:
    """Keep `plan`'s document in its namespace, unless it is there already."""
    path = plan_path(plan.identity.checkpoint_namespace, fingerprint(plan))
    if not storage.exists(path):
        storage.put(path, compiler.dump_document(plan).encode())


def recorded(storage: Storage, namespace: str, plan_fingerprint: str) -> PartitionedPlan | None:
    """The plan of that fingerprint as recorded in the namespace, or None when it was never recorded."""
    path = plan_path(namespace, plan_fingerprint)
    if not storage.exists(path):
        return None
    plan = compiler.load_document(storage.get(path).decode(), origin=path)
    return plan if isinstance(plan, PartitionedPlan) else None


def check_change(
    storage: Storage, plan: PartitionedPlan, point: RestorePoint, *, drop_state: Iterable[str] = ()
) -> compat.Verdict | None:
    """The verdict on restoring `point` (taken with another plan) into `plan`; None when it is the same plan.

    RestoreRefused when the change is REFUSED (its reasons), or when the plan the point
    was taken with is not recorded (an epoch taken before plans were kept).
    """
    if point.from_plan is None or point.from_plan == fingerprint(plan):
        return None
    namespace = plan.identity.checkpoint_namespace
    old = recorded(storage, namespace, point.from_plan)
    if old is None:
        raise RestoreRefused(
            f"savepoint epoch {point.epoch} was taken with plan {point.from_plan}, whose document"
            f" {storage.describe()}/{plan_path(namespace, point.from_plan)} is missing: the change"
            " cannot be checked (run the version that took it, or start over with --fresh)"
        )
    verdict = compat.check_compatibility(old, plan, drop_state=drop_state)
    if verdict.change is compat.ChangeKind.REFUSED:
        reasons = "; ".join(str(r) for r in verdict.reasons if r.kind is compat.ChangeKind.REFUSED)
        raise RestoreRefused(
            f"the change from savepoint epoch {point.epoch} (plan {point.from_plan[:19]}) is refused:"
            f" {reasons}"
        )
    return verdict
