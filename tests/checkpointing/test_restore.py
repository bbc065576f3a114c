"""The restore point every start of a run begins from, and lineages: on a local directory and on MinIO."""

from __future__ import annotations

import pytest

from nopstream.checkpoint import catalog, lineage, restore
from nopstream.checkpoint.formats import Manifest, encode_manifest, encode_segment, manifest_path, segment_ref
from nopstream.checkpoint.restore import NewLineage, RestorePoint, RestoreRequest
from nopstream.errors import RestoreRefused
from nopstream.model.load import load_data
from nopstream.plan import compiler
from nopstream.plan.canonical import fingerprint
from nopstream.plan.epochs import EpochKind

NS = "job/main"


@pytest.fixture
def plan():
    model = {
        "jobId": "job",
        "model": {
            "sources": [{"id": "lines", "type": "file", "config": {"path": "in/*.txt"}}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    return compiler.compile_model(load_data(model)).partitioned


def durable(storage, plan, epoch: int, kind: str = "checkpoint") -> None:
    body = Manifest(epoch=epoch, kind=EpochKind(kind), plan_fingerprint=fingerprint(plan))
    storage.put(manifest_path(NS, epoch), encode_manifest(body))


def test_nothing_durable_restores_nothing_and_numbers_from_one(storage, plan):
    assert restore.choose(storage, plan) == RestorePoint(None, None, lineage=1, next_epoch=1)


def test_the_latest_durable_epoch_and_numbers_past_every_epoch_in_storage(storage, plan):
    for epoch in (1, 2, 3):
        durable(storage, plan, epoch)
    storage.put(f"checkpoint/{NS}/5/out/0/operator/state", b"in flight when a run died")
    point = restore.choose(storage, plan, log_highest=4)
    assert point == RestorePoint(3, "checkpoint", lineage=1, next_epoch=6)
    assert RestorePoint.from_json(point.to_json()) == point
    durable(storage, plan, 7, kind="final")
    assert restore.choose(storage, plan).finished


def test_a_durable_epoch_of_the_log_missing_in_storage_is_refused(storage, plan):
    durable(storage, plan, 2)
    with pytest.raises(RestoreRefused) as refused:
        restore.choose(storage, plan, log_latest=4)
    assert str(refused.value) == (
        f"epoch 4 is durable in the epoch log but its manifest {storage.describe()}/{manifest_path(NS, 4)}"
        " is missing or damaged; the latest manifest found is of epoch 2"
        " (restore an older epoch explicitly with --restore-from)"
    )
    assert restore.choose(storage, plan, log_latest=2).epoch == 2


def test_a_new_lineage_restores_nothing_once_per_nonce_and_its_epochs_come_after(storage, plan):
    for epoch in (1, 2, 3):
        durable(storage, plan, epoch, kind="final" if epoch == 3 else "checkpoint")
    fresh = restore.choose(storage, plan, new_lineage=NewLineage("n1"))
    assert fresh == RestorePoint(None, None, lineage=2, next_epoch=4)
    assert restore.choose(storage, plan, new_lineage=NewLineage("n1")) == fresh  # a recovery of that run
    durable(storage, plan, 4)
    assert restore.choose(storage, plan, new_lineage=NewLineage("n1")).epoch == 4
    assert restore.choose(storage, plan).epoch == 4
    again = restore.choose(storage, plan, new_lineage=NewLineage("n2", base=2))
    assert again == RestorePoint(2, "checkpoint", lineage=3, next_epoch=5)  # from the base until its own
    durable(storage, plan, 5)
    assert restore.choose(storage, plan) == RestorePoint(5, "checkpoint", lineage=3, next_epoch=6)
    record = lineage.current(storage, NS)
    assert (record.number, record.first_epoch, record.base, record.nonce) == (3, 5, 2, "n2")


def test_starting_over_an_empty_namespace_is_its_first_lineage(storage, plan):
    assert restore.choose(storage, plan, new_lineage=NewLineage("n1")).lineage == 1
    assert lineage.current(storage, NS).nonce == "n1"


def test_a_new_lineage_from_an_epoch_that_is_not_durable_is_refused(storage, plan):
    durable(storage, plan, 1)
    with pytest.raises(RestoreRefused, match="epoch 9 has no manifest"):
        restore.choose(storage, plan, new_lineage=NewLineage("n1", base=9))
    assert lineage.current(storage, NS) == lineage.Lineage()  # nothing was started


def test_a_damaged_lineage_record_is_refused_naming_it(storage, plan):
    storage.put(lineage.lineage_path(NS), b"{not json")
    with pytest.raises(RestoreRefused, match=f"lineage record {lineage.lineage_path(NS)} is damaged"):
        restore.choose(storage, plan)


def test_a_restore_point_a_refusal_and_a_request_round_trip_through_their_codecs():
    point = RestorePoint(3, EpochKind.STOP, lineage=2, next_epoch=7, from_plan="sha256:ab")
    assert RestorePoint.from_json(point.to_json()) == point
    with pytest.raises(RestoreRefused) as refused:
        RestorePoint.from_json(RestorePoint.refusal_json("the manifest of epoch 4 is missing"))
    assert str(refused.value) == "the manifest of epoch 4 is missing"
    for request in (
        RestoreRequest(),
        RestoreRequest(new_lineage=NewLineage("n1", base=5)),
        RestoreRequest(from_plan="sha256:cd"),
    ):
        assert RestoreRequest.from_json(request.to_json()) == request


def test_a_refused_restore_from_starts_no_lineage(storage, plan):
    """`--restore-from 13`, 13 damaged, was refused but recorded its lineage: every later run was refused."""
    task = plan.task_ids()[0]
    for epoch in (1, 2):
        path = f"checkpoint/{NS}/{epoch}/{task}/operator/state"
        data = encode_segment({"n": epoch}, state_name="state", schema_version=1)
        storage.put(path, data)
        ref = segment_ref(path, data)
        body = Manifest(epoch, EpochKind.CHECKPOINT, fingerprint(plan), tasks={task: (ref,)})
        storage.put(manifest_path(NS, epoch), encode_manifest(body))
    storage.put(f"checkpoint/{NS}/1/{task}/operator/state", b"altered after it was durable")
    with pytest.raises(RestoreRefused, match=f"checkpoint/{NS}/1/{task}/operator/state"):
        restore.choose(storage, plan, new_lineage=NewLineage("n1", base=1))
    assert lineage.current(storage, NS) == lineage.Lineage()  # nothing was started
    assert restore.choose(storage, plan).epoch == 2  # a plain run goes on from the latest
    point = restore.choose(storage, plan, new_lineage=NewLineage("n2", base=2))
    assert point == RestorePoint(2, "checkpoint", lineage=2, next_epoch=3)
    assert lineage.current(storage, NS).nonce == "n2"


def test_a_manifest_of_an_epoch_a_later_run_abandoned_is_never_durable_however_late_it_lands(storage, plan):
    """Fencing storage: a run restores epoch 3 while 4 and 5 were in flight, and records so before its
    tasks restore; the manifest of 4 a deposed coordinator writes after that is never durable: not
    restored, not listed, refused to --restore-from, deleted by retention with the record once the
    run's own epochs are durable."""
    for epoch in (1, 2, 3):
        durable(storage, plan, epoch)
    storage.put(f"checkpoint/{NS}/4/out/0/operator/state", b"staged by the run before")
    point = restore.choose(storage, plan, log_highest=5)
    assert point == RestorePoint(3, "checkpoint", lineage=1, next_epoch=6)
    record = f"checkpoint/{NS}/_restores/000000000006-after-000000000003"
    assert storage.list(f"checkpoint/{NS}/_restores/") == [record]
    durable(storage, plan, 4)  # late: the deposed coordinator resumed
    assert catalog.Stored.read(storage, NS).durable() == [1, 2, 3]
    assert catalog.durable_epochs(storage, NS) == [1, 2, 3]
    assert restore.choose(storage, plan, log_highest=5).epoch == 3  # a second start of the run: the same
    with pytest.raises(RestoreRefused) as refused:
        restore.choose(storage, plan, new_lineage=NewLineage("again", base=4))
    assert str(refused.value) == (
        "epoch 4 was abandoned by a later run, which kept the epochs up to 3 and numbered its own from 6:"
        " its manifest came after that run began (a deposed coordinator's), and its sinks' transactions"
        " were aborted"
    )
    durable(storage, plan, 6)
    durable(storage, plan, 7)
    assert restore.choose(storage, plan).epoch == 7
    catalog.apply_retention(storage, NS, keep=2)
    assert sorted(storage.list(f"checkpoint/{NS}/")) == [manifest_path(NS, 6), manifest_path(NS, 7)]


def test_a_run_with_no_epoch_in_flight_and_a_new_lineage_record_nothing(storage, plan):
    """Nothing between the restored epoch and the next: no record (one PUT saved per recovery); a new
    lineage numbers past every epoch, so the older lineage's epochs stay restorable with --restore-from."""
    durable(storage, plan, 1)
    durable(storage, plan, 2, kind="savepoint")
    assert restore.choose(storage, plan).next_epoch == 3
    fresh = restore.choose(storage, plan, new_lineage=NewLineage("fresh"))
    assert fresh == RestorePoint(None, None, lineage=2, next_epoch=3)
    assert storage.list(f"checkpoint/{NS}/_restores/") == []
    assert restore.choose(storage, plan, new_lineage=NewLineage("back", base=2)).epoch == 2
