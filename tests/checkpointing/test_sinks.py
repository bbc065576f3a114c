"""The staged file sink: transaction ids, staging, idempotent commits, recovery."""

from __future__ import annotations

from nopstream.connectors.files import FileSink
from nopstream.runtime.frames import Batch


def sink(tmp_path) -> FileSink:
    return FileSink(
        {"path": str(tmp_path / "out")}, operator_id="out", subtask=1, txn_prefix="job:main:out:1"
    )


def test_transactions_are_staged_committed_once_and_recovered(tmp_path):
    s = sink(tmp_path)
    s.write(Batch([{"a": 1}]))
    s.prepare(1)
    s.write(Batch([{"a": 2}, {"a": 3}]))
    s.prepare(2)
    s.write(Batch([{"a": 4}]))  # transaction 3 is open
    state = s.snapshot()
    assert state == {
        "pending": [
            {"id": "job:main:out:1:1", "epoch": 1, "records": 1},
            {"id": "job:main:out:1:2", "epoch": 2, "records": 2},
        ],
        "epoch": 3,
    }
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("*.jsonl")) == []  # nothing visible before a commit
    s.commit(1)
    s.commit(1)  # idempotent
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["out-1-0000000001.jsonl"]
    # the process dies here; a new one restores the snapshot taken at epoch 2 (durable)
    s.finish()
    again = sink(tmp_path)
    again.restore(state)
    again.recover(2)
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["out-1-0000000001.jsonl", "out-1-0000000002.jsonl"]
    assert list((out / ".staging").iterdir()) == []  # transaction 3 was aborted
    assert (out / "out-1-0000000002.jsonl").read_text() == '{"a":2}\n{"a":3}\n'
    assert again.snapshot() == {"pending": [], "epoch": 3}


def test_a_transaction_closed_by_a_later_epoch_number_is_published_under_it(tmp_path):
    # After a recovery a cluster coordinator numbers past every epoch in its log: the
    # restored sink opened transaction 3, and barrier 5 is the one that closes it.
    s = sink(tmp_path)
    s.recover(2)
    s.write(Batch([{"a": 1}, {"a": 2}]))
    s.prepare(5)
    assert s.snapshot() == {"pending": [{"id": "job:main:out:1:5", "epoch": 5, "records": 2}], "epoch": 6}
    assert [p.name for p in (tmp_path / "out" / ".staging").iterdir()] == ["out-1-0000000005.jsonl"]
    s.commit(5)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["out-1-0000000005.jsonl"]
    assert (out / "out-1-0000000005.jsonl").read_text() == '{"a":1}\n{"a":2}\n'
    assert list((out / ".staging").iterdir()) == []
