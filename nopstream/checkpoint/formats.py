"""State segments and epoch manifests: their bytes, checksums and verification.

Segment: one JSON header line, then the payload.
    {"bytes": N, "codec": "json", "format": "nopstream-segment", "formatVersion": 1,
     "schemaVersion": V, "sha256": "<hex of payload>", "stateName": "<name>"}\\n<payload>
Manifest (`checkpoint/{ns}/{epoch}/_manifest.json`, the commit point of an epoch):
canonical JSON with the job identity, epoch, kind (checkpoint, savepoint, final),
plan fingerprint, state format version, creation time, every task's segment
references (path, sha256, bytes), source offsets and enumerator state, sink
transactions, and `checksum`: the SHA-256 of the manifest's canonical JSON without
that field. Anything that does not verify refuses the restore with a message that
names the object and the epoch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from nopstream.errors import RestoreRefused
from nopstream.plan.epochs import EpochKind

SEGMENT_FORMAT = "nopstream-segment"
MANIFEST_FORMAT = "nopstream-manifest"
FORMAT_VERSION = 1
STATE_FORMAT_VERSION = 1
MANIFEST_NAME = "_manifest.json"

PAYLOAD_CODECS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "json": (orjson.dumps, orjson.loads),
}
"""Payload codecs by name: (encode, decode). A segment names the codec it was written with."""


@dataclass(frozen=True)
class SegmentRef:
    """Where a segment is and what its payload must hash to."""

    path: str
    sha256: str
    bytes: int

    def to_json(self) -> dict[str, Any]:
        """The reference as a manifest or an ACK holds it."""
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SegmentRef:
        """Parse `to_json`'s output; KeyError, TypeError or ValueError when it has another shape."""
        return cls(str(raw["path"]), str(raw["sha256"]), int(raw["bytes"]))


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode_segment(payload: Any, *, state_name: str, schema_version: int, codec: str = "json") -> bytes:
    """The bytes of a segment holding `payload`."""
    body = PAYLOAD_CODECS[codec][0](payload)
    header = {
        "format": SEGMENT_FORMAT,
        "formatVersion": FORMAT_VERSION,
        "codec": codec,
        "stateName": state_name,
        "schemaVersion": schema_version,
        "sha256": hashlib.sha256(body).hexdigest(),
        "bytes": len(body),
    }
    return _canonical(header) + b"\n" + body


def segment_ref(path: str, data: bytes) -> SegmentRef:
    """The reference a manifest keeps for a segment written at `path`."""
    return SegmentRef(path, hashlib.sha256(data).hexdigest(), len(data))


def decode_segment(
    data: bytes, *, path: str, epoch: int, ref: SegmentRef | None = None
) -> tuple[dict[str, Any], Any]:
    """(header, payload) of a segment; RestoreRefused naming the segment and epoch when damaged."""
    where = f"segment {path} of epoch {epoch}"
    if ref is not None and (len(data) != ref.bytes or hashlib.sha256(data).hexdigest() != ref.sha256):
        raise RestoreRefused(f"{where} does not match its manifest entry (size or SHA-256 differ)")
    head, sep, body = data.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        raise RestoreRefused(f"{where} has no readable header") from None
    if not sep or header.get("format") != SEGMENT_FORMAT:
        raise RestoreRefused(f"{where} is not a nopstream segment")
    if len(body) != header.get("bytes"):
        raise RestoreRefused(f"{where} is truncated: {len(body)} of {header.get('bytes')} payload bytes")
    if hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise RestoreRefused(f"{where} is damaged: its payload does not match its SHA-256")
    codec = PAYLOAD_CODECS.get(header.get("codec", ""))
    if codec is None:
        raise RestoreRefused(f"{where} uses unknown codec {header.get('codec')!r}")
    return header, codec[1](body)


def manifest_path(namespace: str, epoch: int) -> str:
    """The manifest key of an epoch (DESIGN.md section 2)."""
    return f"checkpoint/{namespace}/{epoch}/{MANIFEST_NAME}"


@dataclass(frozen=True)
class Manifest:
    """A durable epoch's commit record: the epoch, its kind and plan, and what makes it up.

    `tasks` names each task's segment references, `sources` each source task's
    positions, `sinks` each sink task's pending transactions (id, epoch, records,
    lineage; their contents stay in the segments). `checksum` is set when read.
    """

    epoch: int
    kind: EpochKind
    plan_fingerprint: str
    job_id: str = ""
    pipeline_id: str = ""
    checkpoint_namespace: str = ""
    plan_version: int = 1
    created_at: str = ""
    duration_ms: int = 0
    tasks: dict[str, tuple[SegmentRef, ...]] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)
    sinks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    checksum: str = ""

    def segments(self) -> list[SegmentRef]:
        """Every segment reference of every task."""
        return [ref for refs in self.tasks.values() for ref in refs]

    def to_json(self) -> dict[str, Any]:
        """The manifest's JSON object, without format fields and checksum."""
        return {
            "jobId": self.job_id,
            "pipelineId": self.pipeline_id,
            "checkpointNamespace": self.checkpoint_namespace,
            "planVersion": self.plan_version,
            "epoch": self.epoch,
            "kind": str(self.kind),
            "planFingerprint": self.plan_fingerprint,
            "createdAt": self.created_at,
            "durationMs": self.duration_ms,
            "tasks": {t: {"segments": [r.to_json() for r in refs]} for t, refs in sorted(self.tasks.items())},
            "sources": dict(sorted(self.sources.items())),
            "sinks": dict(sorted(self.sinks.items())),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], *, where: str) -> Manifest:
        """A manifest from its verified JSON; RestoreRefused naming `where` when a part has another shape."""
        try:
            tasks = {
                t: tuple(SegmentRef.from_json(r) for r in entry.get("segments", []))
                for t, entry in raw.get("tasks", {}).items()
            }
            return cls(
                epoch=int(raw["epoch"]),
                kind=EpochKind(raw.get("kind", EpochKind.CHECKPOINT)),
                plan_fingerprint=str(raw.get("planFingerprint", "")),
                job_id=str(raw.get("jobId", "")),
                pipeline_id=str(raw.get("pipelineId", "")),
                checkpoint_namespace=str(raw.get("checkpointNamespace", "")),
                plan_version=int(raw.get("planVersion", 1)),
                created_at=str(raw.get("createdAt", "")),
                duration_ms=int(raw.get("durationMs", 0)),
                tasks=tasks,
                sources=dict(raw.get("sources", {})),
                sinks=dict(raw.get("sinks", {})),
                checksum=str(raw.get("checksum", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise RestoreRefused(f"{where} is malformed ({type(err).__name__}: {err})") from None


def encode_manifest(manifest: Manifest) -> bytes:
    """The manifest's bytes, with its format fields and checksum."""
    body = {
        **manifest.to_json(),
        "format": MANIFEST_FORMAT,
        "formatVersion": FORMAT_VERSION,
        "stateFormatVersion": STATE_FORMAT_VERSION,
    }
    body["checksum"] = hashlib.sha256(_canonical(body)).hexdigest()
    return _canonical(body)


def decode_manifest(data: bytes, *, path: str, epoch: int) -> Manifest:
    """A manifest from its bytes; RestoreRefused when it does not verify."""
    where = f"manifest {path} of epoch {epoch}"
    try:
        manifest: dict[str, Any] = json.loads(data)
    except ValueError:
        raise RestoreRefused(f"{where} is not valid JSON") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise RestoreRefused(f"{where} is not a nopstream manifest")
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    actual = hashlib.sha256(_canonical(body)).hexdigest()
    if manifest.get("checksum") != actual:
        raise RestoreRefused(
            f"{where} has a wrong checksum: recorded {manifest.get('checksum')}, computed {actual}"
        )
    if manifest.get("epoch") != epoch:
        raise RestoreRefused(f"{where} records epoch {manifest.get('epoch')}")
    if manifest.get("stateFormatVersion") != STATE_FORMAT_VERSION:
        raise RestoreRefused(
            f"{where} has state format version {manifest.get('stateFormatVersion')}; this build reads"
            f" {STATE_FORMAT_VERSION}"
        )
    return Manifest.from_json(manifest, where=where)


def check_plan(manifest: Manifest, *, fingerprint: str, epoch: int) -> None:
    """Refuse a restore into a plan other than the one the epoch was taken with."""
    recorded = manifest.plan_fingerprint
    if recorded != fingerprint:
        raise RestoreRefused(
            f"epoch {epoch} was taken with plan {recorded[:19]}, the plan to restore is {fingerprint[:19]}: a"
            " changed job starts from a stop savepoint (run the version that took the epoch, `nopstream"
            " savepoint --stop FILE` while it runs, then run the changed one; or start over with --fresh)"
        )
