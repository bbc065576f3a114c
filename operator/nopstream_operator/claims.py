"""One StreamJob per checkpoint namespace in a storage, across every Kubernetes namespace.

A job's etcd keys sit under its Kubernetes namespace, so two StreamJobs of two namespaces
given the same explicit `checkpointNamespace` and storage would share checkpoints while
their coordinations never meet. Before a pass acts, the job claims its checkpoint
namespace in etcd (a key named by the storage and the namespace, created only when
absent, holding the StreamJob's namespace, name and uid); a job whose claim another
holds does nothing and says who holds it, until that StreamJob is deleted (a claim whose
holder no longer exists, its deletion missed, is taken over). A job keeps each claim it
took until it is deleted (its checkpoints are there): `release` then drops every claim of
its uid.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from nopstream.plan.compiler import CompiledPlans
from nopstream_operator.acts import waits
from nopstream_operator.kube import EtcdView
from nopstream_operator.observed import Context, Observed

CLAIMS = "/nopstream-operator/checkpoint-namespaces/"
RULE = (
    "one StreamJob per checkpoint namespace; delete that StreamJob or give this one another"
    " checkpointNamespace"
)


@dataclass(frozen=True)
class Holder:
    """The StreamJob holding a claim."""

    namespace: str
    name: str
    uid: str

    def to_json(self) -> bytes:
        """Canonical JSON (the claim's value)."""
        return json.dumps(
            {"namespace": self.namespace, "name": self.name, "uid": self.uid}, sort_keys=True
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Holder:
        """Parse `to_json`'s output."""
        raw: dict[str, Any] = json.loads(data)
        return cls(str(raw["namespace"]), str(raw["name"]), str(raw["uid"]))

    @classmethod
    def of(cls, job: dict[str, Any]) -> Holder:
        """The holder a StreamJob is."""
        meta = job["metadata"]
        return cls(meta.get("namespace") or "default", meta["name"], meta["uid"])


def where(plans: CompiledPlans) -> str:
    """The job's checkpoint namespace and storage, in words (equal for equal places)."""
    s = plans.deployment.storage
    storage = f"s3 {s.endpoint} {s.bucket}/{s.prefix or ''}" if s.kind == "s3" else f"local {s.path}"
    return f"checkpoint namespace '{plans.partitioned.identity.checkpoint_namespace}' in {storage}"


def claim_key(plans: CompiledPlans) -> str:
    """The etcd key of the claim on the job's checkpoint namespace in its storage."""
    return CLAIMS + hashlib.sha256(where(plans).encode()).hexdigest()[:40]


def refusal(plans: CompiledPlans, other: Holder) -> str:
    """What a job whose checkpoint namespace `other` holds is told."""
    return f"{where(plans)} is held by StreamJob {other.namespace}/{other.name} ({RULE})"


def holds_checkpoints(ctx: Context, seen: Observed, plans: CompiledPlans) -> bool:
    """Whether the job holds its checkpoint namespace, claimed now when free; while another StreamJob
    holds it, the job waits, Pending, naming the holder."""
    ours, key = Holder.of(seen.job), claim_key(plans)
    held = ctx.etcd.hold(key, ours.to_json())
    holder = Holder.from_json(held)
    if holder.uid == ours.uid:
        return True
    other = ctx.kube.job(holder.namespace, holder.name)
    if other is None or other["metadata"]["uid"] != holder.uid:  # deleted while no operator watched
        return ctx.etcd.replace(key, held, ours.to_json())
    waits(ctx, seen, "CheckpointNamespaceHeld", refusal(plans, holder))
    return False


def release(etcd: EtcdView, uid: str) -> int:
    """Drop every claim the StreamJob of `uid` holds (it is deleted); how many."""
    return etcd.drop_held(CLAIMS, lambda value: Holder.from_json(value).uid == uid)
