"""A checkpoint split by one plan and joined by a rescaled one: state goes to its new owners."""

from __future__ import annotations

from nopstream.checkpoint import snapshots
from nopstream.checkpoint.formats import decode_segment
from nopstream.model.load import load_data
from nopstream.plan import compiler
from nopstream.records import TaskSnapshot


def plan(parallelism: int):
    model = {
        "jobId": "rescale",
        "parallelism": parallelism,
        "model": {
            "sources": [{"id": "src", "type": "file", "config": {"path": "in/*.txt"}}],
            "operators": [{"id": "count", "type": "aggregate", "key": {"field": "k"}, "aggregate": "count"}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    return compiler.compile_model(load_data(model), backend="local").partitioned


def checkpoint_of(old, *, pending: bool = False) -> dict[str, object]:
    """The segments of epoch 8 of `old`'s count and source tasks (path -> payload).

    Each count subtask holds one key per shard and a watermark; with `pending`, its sink
    holds transaction 8. Each source subtask has read one file and finished another.
    """
    segments: dict[str, object] = {}
    for sub in old.vertex("count").subtasks:
        txns = [{"id": f"rescale:main:out:{sub.index}:8", "epoch": 8, "records": 1}] if pending else []
        state = TaskSnapshot(
            operators={
                "count": {
                    "keyed": {
                        str(shard): {"acc": [[f"k{shard}", shard]]}
                        for shard in range(sub.shards.start, sub.shards.end)
                    },
                    "watermark": 100 + sub.index,
                },
                "out": {"sink": {"pending": txns, "epoch": 9}},
            },
            watermarks={"x": 1},
        )
        parts = snapshots.split(
            old, vertex_id="count", subtask=sub.index, epoch=8, state=state, source_id=None, sink_ids=["out"]
        )
        segments.update({path: _payload(data) for path, data in parts.items()})
    for sub in old.vertex("src").subtasks:
        cursors = {f"in/{sub.index}.txt": 40 + sub.index}
        finished = [f"in/done-{sub.index}.txt"]
        state = TaskSnapshot(operators={}, source={"cursors": cursors, "finished": finished})
        parts = snapshots.split(
            old, vertex_id="src", subtask=sub.index, epoch=8, state=state, source_id="src", sink_ids=[]
        )
        segments.update({path: _payload(data) for path, data in parts.items()})
    return segments


def test_keyed_state_cursors_and_finished_splits_follow_ownership_after_a_rescale():
    old, new = plan(3), plan(4)
    count_new = new.vertex("count")
    segments = checkpoint_of(old)

    owned_by = {}
    for sub in count_new.subtasks:
        joined = snapshots.join(
            new, vertex_id="count", subtask=sub.index, epoch=8, segments=segments,
            operator_ids=["count", "out"], source_id=None, sink_ids=["out"], shards=sub.shards, rescaled=True,
        )  # fmt: skip
        keyed = joined.operators["count"]["keyed"]
        assert set(keyed) == {str(s) for s in range(sub.shards.start, sub.shards.end)}
        owned_by.update({shard: sub.index for shard in keyed})
        # operator state of the same subtask, or subtask 0's for the new one; fresh watermarks
        assert joined.operators["count"]["watermark"] == 100 + (sub.index if sub.index < 3 else 0)
        assert joined.operators["out"]["sink"] == {"pending": [], "epoch": 9}
        assert joined.watermarks is None
    assert sorted(int(s) for s in owned_by) == list(range(new.identity.state_shard_count))
    source = snapshots.join(
        new, vertex_id="src", subtask=3, epoch=8, segments=segments,
        operator_ids=[], source_id="src", sink_ids=[], shards=None, rescaled=True,
    ).source  # fmt: skip
    assert source == {
        "cursors": {"in/0.txt": 40, "in/1.txt": 41, "in/2.txt": 42},
        "finished": ["in/done-0.txt", "in/done-1.txt", "in/done-2.txt"],
    }


def test_a_task_reads_only_what_join_takes_for_it_rescaled_or_not():
    """`needed` selects exactly the segments `join` reads: joined over them alone, every task of
    the same plan and of a rescaled one gets the state it gets from the whole checkpoint."""
    old = plan(3)
    segments = checkpoint_of(old, pending=True)
    for target, rescaled in ((old, False), (plan(4), True), (plan(2), True)):
        for vertex, ids in (("count", dict(operator_ids=["count", "out"], source_id=None, sink_ids=["out"])),
                            ("src", dict(operator_ids=[], source_id="src", sink_ids=[]))):  # fmt: skip
            for sub in target.vertex(vertex).subtasks:
                part = dict(
                    vertex_id=vertex, subtask=sub.index, epoch=8, shards=sub.shards, rescaled=rescaled, **ids
                )
                wanted = snapshots.needed(target, **part)
                own = {path: payload for path, payload in segments.items() if wanted(path)}
                assert snapshots.join(target, segments=own, **part) == snapshots.join(
                    target, segments=segments, **part
                ), (vertex, sub.index, rescaled)
                if vertex == "count":  # its own shards, not every subtask's
                    keyed = [p for p in own if p.split("/")[-2].isdigit()]
                    assert len(keyed) == sub.shards.end - sub.shards.start
                    assert len(own) < len(segments) // 2
                else:  # every split and enumerator of the source, nothing of the count's
                    assert all("/8/src/" in p for p in own)
                    assert sum("/source/" in p for p in own) == 3


def _payload(data: bytes) -> object:
    return decode_segment(data, path="p", epoch=8)[1]


def test_every_subtask_a_rescale_adds_gets_the_broadcast_state():
    def rules_plan(parallelism: int):
        model = {
            "jobId": "rules",
            "parallelism": parallelism,
            "model": {
                "sources": [
                    {"id": "txns", "type": "generator", "config": {"count": 10}},
                    {"id": "rules", "type": "generator", "parallelism": 1, "config": {"count": 2}},
                ],
                "operators": [
                    {
                        "id": "check",
                        "type": "process",
                        "inputs": ["txns", "rules"],
                        "broadcast": ["rules"],
                        "key": {"field": "k"},
                        "fn": "m:Rules",
                    },
                ],
                "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
            },
        }
        return compiler.compile_model(load_data(model), backend="local").partitioned

    old, new = rules_plan(2), rules_plan(3)
    broadcast = {"rules": {"max-amount": [[100, {"limit": 5}], [200, {"limit": 7}]]}}
    segments: dict[str, object] = {}
    for sub in old.vertex("check").subtasks:
        state = TaskSnapshot(
            operators={"check": {"watermark": 150, "broadcast": broadcast}, "out": {"sink": {}}}
        )
        parts = snapshots.split(
            old, vertex_id="check", subtask=sub.index, epoch=8, state=state, source_id=None, sink_ids=["out"]
        )
        segments.update({path: _payload(data) for path, data in parts.items()})
    for sub in new.vertex("check").subtasks:
        joined = snapshots.join(
            new, vertex_id="check", subtask=sub.index, epoch=8, segments=segments,
            operator_ids=["check", "out"], source_id=None, sink_ids=["out"], shards=sub.shards, rescaled=True,
        )  # fmt: skip
        assert joined.operators["check"]["broadcast"] == broadcast, sub.index
