"""The committing sinks (file and S3): transaction ids, staging, idempotent commits, and the
recovery every start of a run goes through."""

from __future__ import annotations

import pytest

from nopstream.connectors.files import FileSink
from nopstream.connectors.s3 import S3Sink
from nopstream.connectors.staged import OutputConflict, SinkName
from nopstream.errors import RestoreRefused
from nopstream.records import Batch, SinkStart

NAME = SinkName("job", "main", "out", 1)


def obj(epoch: int, lineage: int = 1, name: SinkName = NAME) -> str:
    return name.object(lineage, epoch, "jsonl")


class Files:
    """A file sink and what its output directory holds."""

    def __init__(self, tmp_path):
        self.dir = tmp_path / "out"

    def sink(self, name: SinkName = NAME) -> FileSink:
        return FileSink({"path": str(self.dir)}, name=name)

    def committed(self) -> list[str]:
        return sorted(p.name for p in self.dir.glob("*.jsonl"))

    def staged(self) -> list[str]:
        return sorted(p.name for p in (self.dir / ".staging").iterdir())

    def read(self, name: str) -> str:
        return (self.dir / name).read_text()

    def put(self, name: str, text: str, *, staged: bool = False) -> None:
        target = self.dir / ".staging" / name if staged else self.dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


class Objects:
    """An S3 sink on the real MinIO server and what its prefix holds."""

    def __init__(self, request, monkeypatch):
        server = request.getfixturevalue("minio_server")
        self.client = request.getfixturevalue("minio_client")
        self.bucket = request.getfixturevalue("bucket")
        monkeypatch.setenv("NOPSTREAM_S3_ACCESS_KEY", server.access_key)
        monkeypatch.setenv("NOPSTREAM_S3_SECRET_KEY", server.secret_key)
        self.config = {"endpoint": server.url, "bucket": self.bucket, "prefix": "out/"}

    def sink(self, name: SinkName = NAME) -> S3Sink:
        return S3Sink(self.config, name=name)

    def _names(self, prefix: str) -> list[str]:
        found = self.client.list_objects(self.bucket, prefix=prefix)
        return sorted(o.object_name[len(prefix) :] for o in found if not o.is_dir)

    def committed(self) -> list[str]:
        return self._names("out/")

    def staged(self) -> list[str]:
        return self._names("out/.staging/")

    def read(self, name: str) -> str:
        body = self.client.get_object(self.bucket, f"out/{name}")
        try:
            return body.read().decode()
        finally:
            body.close()
            body.release_conn()

    def put(self, name: str, text: str, *, staged: bool = False) -> None:
        import io

        data = text.encode()
        key = f"out/.staging/{name}" if staged else f"out/{name}"
        self.client.put_object(self.bucket, key, io.BytesIO(data), len(data))


@pytest.fixture(params=["file", "s3"])
def where(request, tmp_path, monkeypatch):
    """Where a sink writes: a directory, or a prefix of a bucket on the real MinIO server."""
    return Files(tmp_path) if request.param == "file" else Objects(request, monkeypatch)


def test_transactions_are_staged_committed_once_and_recovered(where):
    s = where.sink()
    s.recover(SinkStart(None))
    s.write(Batch([{"a": 1}]))
    s.prepare(1)
    s.write(Batch([{"a": 2}, {"a": 3}]))
    s.prepare(2)
    s.write(Batch([{"a": 4}]))  # transaction 3 is open
    state = s.snapshot()
    assert state == {
        "pending": [
            {"id": "job:main:out:1:1", "epoch": 1, "records": 1, "lineage": 1},
            {"id": "job:main:out:1:2", "epoch": 2, "records": 2, "lineage": 1},
        ],
        "epoch": 3,
    }
    assert where.committed() == []  # nothing visible before a commit
    s.commit(1)
    s.commit(1)  # idempotent
    assert where.committed() == [obj(1)] == ["job.main.l1.out.1.0000000001.jsonl"]
    # the process dies here; a new one restores the snapshot taken at epoch 2 (durable)
    s.finish()
    again = where.sink()
    again.restore(state)
    again.recover(SinkStart(2))
    assert where.committed() == [obj(1), obj(2)]
    assert where.staged() == []  # transaction 3 was aborted
    assert where.read(obj(2)) == '{"a":2}\n{"a":3}\n'
    assert again.snapshot() == {"pending": [], "epoch": 3}


def test_a_start_with_nothing_durable_aborts_what_a_dead_run_staged(where):
    # A dead run staged transaction 1 before any epoch was durable; the next start
    # writes transaction 1 again, fresh: the dead run's records must not survive.
    where.put(obj(1), '{"dead":1}\n', staged=True)
    s = where.sink()
    s.recover(SinkStart(None))
    assert where.staged() == []
    s.write(Batch([{"a": 1}]))
    s.prepare(1)
    s.commit(1)
    assert where.read(obj(1)) == '{"a":1}\n'


def test_a_staged_file_is_created_fresh_not_appended_to(tmp_path):
    files = Files(tmp_path)
    s = files.sink()
    s.recover(SinkStart(None))
    files.put(obj(1), '{"dead":1}\n', staged=True)  # appears after the recovery (a zombie's)
    s.write(Batch([{"a": 1}]))
    s.write(Batch([{"a": 2}]))
    s.prepare(1)
    s.commit(1)
    assert files.read(obj(1)) == '{"a":1}\n{"a":2}\n'


def test_a_transaction_closed_by_a_later_epoch_number_is_published_under_it(where):
    # After a recovery epochs are numbered past every epoch in storage: the restored
    # sink opened transaction 3, and barrier 5 is the one that closes it.
    s = where.sink()
    s.recover(SinkStart(2))
    s.write(Batch([{"a": 1}, {"a": 2}]))
    s.prepare(5)
    assert s.snapshot() == {
        "pending": [{"id": "job:main:out:1:5", "epoch": 5, "records": 2, "lineage": 1}],
        "epoch": 6,
    }
    assert where.staged() == [obj(5)]
    s.commit(5)
    assert where.committed() == [obj(5)]
    assert where.read(obj(5)) == '{"a":1}\n{"a":2}\n'
    assert where.staged() == []


def test_committed_output_newer_than_the_restore_point_is_refused(where):
    where.put(obj(7), '{"a":1}\n')
    s = where.sink()
    with pytest.raises(RestoreRefused) as refused:
        s.recover(SinkStart(5))
    assert "sink 'out' subtask 1 already committed epoch 7 (" in str(refused.value)
    assert "after the restore point (epoch 5): the manifest of a later epoch is missing" in str(refused.value)
    where.sink().recover(SinkStart(5, lineage=2))  # another lineage's names: nothing to refuse


def test_other_jobs_and_lineages_are_never_touched_or_replaced(where):
    other = SinkName("other", "main", "out", 1)
    where.put(obj(1, name=other), '{"other":1}\n')
    where.put(obj(2, name=other), '{"other":2}\n', staged=True)
    where.put(obj(1, lineage=1), '{"old":1}\n')  # committed by lineage 1
    where.put(obj(3, lineage=1), '{"old":3}\n', staged=True)  # left staged by lineage 1
    s = where.sink()
    s.recover(SinkStart(None, lineage=2))
    assert where.staged() == [obj(2, name=other)]  # lineage 1's leftover is dropped, not the other job's
    s.write(Batch([{"new": 1}]))
    s.prepare(1)
    s.commit(1)
    assert where.committed() == sorted([obj(1, name=other), obj(1, lineage=1), obj(1, lineage=2)])
    assert where.read(obj(1, name=other)) == '{"other":1}\n'
    assert where.read(obj(1, lineage=1)) == '{"old":1}\n'


def test_a_commit_never_replaces_committed_output_that_is_not_its_own(where):
    s = where.sink()
    s.recover(SinkStart(None))
    s.write(Batch([{"a": 1}]))
    s.prepare(1)
    where.put(obj(1), '{"someone":"else"}\n')  # appeared between pre-commit and commit
    with pytest.raises(
        OutputConflict, match=r"refusing to replace committed output .*job\.main\.l1\.out\.1\.0000000001"
    ):
        s.commit(1)
    assert where.read(obj(1)) == '{"someone":"else"}\n'
    assert where.staged() == [obj(1)]
