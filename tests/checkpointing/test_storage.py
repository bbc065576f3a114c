"""Segments, manifests, verification, and retention, on a local directory and on MinIO."""

from __future__ import annotations

import json

import pytest

from nopstream.checkpoint.catalog import Stored, apply_retention, durable_epochs, load_checkpoint
from nopstream.checkpoint.formats import Manifest, encode_manifest, encode_segment, manifest_path, segment_ref
from nopstream.checkpoint.storage import LocalStorage
from nopstream.errors import RestoreRefused, StorageError
from nopstream.plan.epochs import EpochKind

NS = "job/main"
PLAN = "sha256:" + "ab" * 32


def write_epoch(storage, epoch: int, *, kind: str = "checkpoint", manifest: bool = True) -> Manifest:
    """Write two segments and (unless told not to) the manifest, in that order."""
    refs = []
    for shard, value in ((3, {"acc": [["the", 7]]}), (9, {"acc": [["fox", epoch]]})):
        path = f"checkpoint/{NS}/{epoch}/count/0/{shard}/acc"
        data = encode_segment(value, state_name="acc", schema_version=1)
        storage.put(path, data)
        refs.append(segment_ref(path, data))
    body = Manifest(
        job_id="job",
        pipeline_id="main",
        checkpoint_namespace=NS,
        epoch=epoch,
        kind=EpochKind(kind),
        plan_fingerprint=PLAN,
        created_at="2026-11-29T00:00:00Z",
        tasks={"job/main/count/0": tuple(refs)},
    )
    if manifest:
        storage.put(manifest_path(NS, epoch), encode_manifest(body))
    return body


def test_atomic_put_get_list_delete(storage):
    storage.put("a/b/c", b"one")
    storage.put("a/b/c", b"two")
    storage.put("a/d", b"x")
    assert storage.get("a/b/c") == b"two"
    assert storage.list("a/") == ["a/b/c", "a/d"]
    assert storage.exists("a/d") and not storage.exists("a/zz")
    storage.delete("a/b/c")
    storage.delete("a/b/c")  # a missing object is fine
    assert storage.list("a/") == ["a/d"]
    with pytest.raises(StorageError, match=r"a/b/c is missing"):
        storage.get("a/b/c")


def test_a_prefix_lists_what_starts_with_it_whether_or_not_it_ends_a_directory(storage):
    for path in ("a/b/c", "a/bb", "a/c/b", "ab/x", "z"):
        storage.put(path, b"-")
    assert storage.list("a/b") == ["a/b/c", "a/bb"]
    assert storage.list("a/b/") == ["a/b/c"]
    assert storage.list("a") == ["a/b/c", "a/bb", "a/c/b", "ab/x"]
    assert storage.list("") == ["a/b/c", "a/bb", "a/c/b", "ab/x", "z"]
    assert storage.list("q/r/") == []


def test_a_local_put_that_fails_names_the_object_and_leaves_no_temp_file(tmp_path):
    storage = LocalStorage(tmp_path / "checkpoints")
    (tmp_path / "checkpoints" / "e" / "1" / "b").mkdir(parents=True)  # a directory where b should be
    with pytest.raises(StorageError, match=r"cannot write .*/checkpoints/e/1/b: Is a directory"):
        storage.put_many({"e/1/a": b"1", "e/1/b": b"2", "e/1/c": b"3"})
    assert not [p for p in (tmp_path / "checkpoints").rglob("*") if p.name.startswith(".tmp-")]
    assert storage.list("e/") == ["e/1/c"]  # each object is atomic, a put of several is not
    storage.put_many({f"e/2/{shard}/acc": bytes([shard]) for shard in range(64)})
    assert [storage.get(f"e/2/{shard}/acc") for shard in range(64)] == [bytes([s]) for s in range(64)]


def test_a_durable_epoch_loads_verified(storage):
    write_epoch(storage, 4)
    write_epoch(storage, 5, manifest=False)  # in flight: segments but no manifest yet
    assert durable_epochs(storage, NS) == [4]
    assert Stored.read(storage, NS).latest_durable() == 4
    cp = load_checkpoint(storage, NS, 4, plan_fingerprint=PLAN)
    assert cp.segments == {
        f"checkpoint/{NS}/4/count/0/3/acc": {"acc": [["the", 7]]},
        f"checkpoint/{NS}/4/count/0/9/acc": {"acc": [["fox", 4]]},
    }


def test_truncated_segment_is_refused(storage):
    write_epoch(storage, 2)
    path = f"checkpoint/{NS}/2/count/0/9/acc"
    storage.put(path, storage.get(path)[:-3])
    with pytest.raises(RestoreRefused) as refused:
        load_checkpoint(storage, NS, 2, plan_fingerprint=PLAN)
    assert str(refused.value) == (
        f"segment {path} of epoch 2 does not match its manifest entry (size or SHA-256 differ)"
    )


def test_altered_segment_is_refused_even_with_a_matching_manifest_entry(storage):
    from nopstream.checkpoint.formats import decode_segment

    data = encode_segment({"acc": [["the", 7]]}, state_name="acc", schema_version=1)
    altered = data.replace(b'"the",7', b'"the",8')
    with pytest.raises(RestoreRefused) as refused:
        decode_segment(altered, path="p", epoch=3)
    assert str(refused.value) == "segment p of epoch 3 is damaged: its payload does not match its SHA-256"
    with pytest.raises(RestoreRefused, match="segment p of epoch 3 is truncated: 10 of 19 payload bytes"):
        decode_segment(data[: data.index(b"\n") + 11], path="p", epoch=3)


def test_manifest_with_a_wrong_checksum_is_refused(storage):
    write_epoch(storage, 6)
    path = manifest_path(NS, 6)
    manifest = json.loads(storage.get(path))
    manifest["tasks"]["job/main/count/0"]["segments"] = []
    storage.put(path, json.dumps(manifest).encode())
    with pytest.raises(RestoreRefused) as refused:
        load_checkpoint(storage, NS, 6, plan_fingerprint=PLAN)
    assert str(refused.value).startswith(f"manifest {path} of epoch 6 has a wrong checksum: recorded ")


def test_plan_fingerprint_mismatch_is_refused(storage):
    write_epoch(storage, 7)
    other = "sha256:" + "cd" * 32
    with pytest.raises(RestoreRefused) as refused:
        load_checkpoint(storage, NS, 7, plan_fingerprint=other)
    assert str(refused.value) == (
        f"epoch 7 was taken with plan {PLAN[:19]}, the plan to restore is {other[:19]}: a changed job"
        " starts from a stop savepoint (run the version that took the epoch, `nopstream savepoint --stop"
        " FILE` while it runs, then run the changed one; or start over with --fresh)"
    )


def test_missing_segment_and_missing_manifest_are_refused(storage):
    write_epoch(storage, 8)
    storage.delete(f"checkpoint/{NS}/8/count/0/3/acc")
    with pytest.raises(
        RestoreRefused, match=f"segment checkpoint/{NS}/8/count/0/3/acc of epoch 8 is missing"
    ):
        load_checkpoint(storage, NS, 8, plan_fingerprint=PLAN)
    with pytest.raises(
        RestoreRefused, match=f"epoch 9 has no manifest at .*/checkpoint/{NS}/9/_manifest.json"
    ):
        load_checkpoint(storage, NS, 9, plan_fingerprint=PLAN)


def test_retention_keeps_latest_and_savepoints_and_removes_orphans(storage):
    for epoch in range(1, 8):
        write_epoch(
            storage, epoch, kind="savepoint" if epoch == 2 else "checkpoint", manifest=epoch not in (3, 7)
        )
    # durable: 1, 2 (savepoint), 4, 5, 6; orphan: 3 (older than the latest durable); in flight: 7
    deleted = apply_retention(storage, NS, keep=2)
    assert durable_epochs(storage, NS) == [2, 5, 6]
    remaining = {p.split("/")[3] for p in storage.list(f"checkpoint/{NS}/")}
    assert remaining == {"2", "5", "6", "7"}
    assert f"checkpoint/{NS}/3/count/0/3/acc" in deleted  # the orphan
    assert deleted.index(manifest_path(NS, 1)) < deleted.index(f"checkpoint/{NS}/1/count/0/3/acc")
    assert apply_retention(storage, NS, keep=2) == []  # nothing more to do
