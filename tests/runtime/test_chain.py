"""The operator chain on its own (`runtime.chain`): no task, no channel, no barrier.

A batch runs through every operator in order; the last one's output and each side
output reach `emit` named after the operator that made them; a watermark fires what is
due; snapshot and restore go by operator id.
"""

from __future__ import annotations

import asyncio

from nopstream.plan.partitioned import ShardRange
from nopstream.plan.streamgraph import KeySelector, StreamNode
from nopstream.records import Batch
from nopstream.runtime.chain import Chain
from nopstream.runtime.keyed import ShardCache

KEY = KeySelector(field="k", fn=None)
WINDOW = {"kind": "tumbling", "time": "event", "sizeMs": 10, "lateOutput": "late"}


def node(node_id: str, kind: str, keyed: bool, **spec) -> StreamNode:
    return StreamNode(node_id, "operator", kind, 1, keyed, KEY if keyed else None, {"id": node_id, **spec})


def chain_of(emitted: list[tuple[str, str, list]]) -> Chain:
    """A filter (records with `v`) then a keyed tumbling event-time sum of `v`, late records aside."""

    async def emit(op_id: str, output: str, batch: Batch) -> None:
        emitted.append((op_id, output, batch.records))

    nodes = [
        node("has-v", "filter", False, type="filter", fn="chainfns:has_v"),
        node("sums", "window", True, type="window", aggregate={"kind": "sum", "field": "v"}, window=WINDOW),
    ]
    return Chain(
        nodes,
        subtask=0,
        parallelism=1,
        shards=ShardRange(0, 16),
        cache=ShardCache(16),
        connectors=None,  # type: ignore[arg-type]  # no sink in this chain
        clock=lambda: 0,
        emit=emit,
        origin="src",
    )


def test_a_batch_goes_through_every_operator_and_outputs_are_named_after_their_operator(
    tmp_path, monkeypatch
):
    (tmp_path / "chainfns.py").write_text('def has_v(record):\n    return "v" in record\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    emitted: list[tuple[str, str, list]] = []
    chain = chain_of(emitted)
    records = [{"k": "a", "v": 1}, {"k": "a"}, {"k": "a", "v": 2}, {"k": "b", "v": 5}]
    asyncio.run(chain.push(0, Batch(records, [1, 2, 5, 9], [0, 0, 0, 0]), 0))
    assert emitted == []  # the window holds them until its end
    assert asyncio.run(chain.advance(9)) == 9  # no operator holds the watermark back
    assert sorted(emitted[0][2], key=lambda r: r["key"]) == [
        {"key": "a", "start": 0, "end": 10, "value": 3},
        {"key": "b", "start": 0, "end": 10, "value": 5},
    ]
    assert [(op, out) for op, out, _ in emitted] == [("sums", "main")]
    # behind its mark (its split's watermark when read, 10): late, named after the window
    asyncio.run(chain.push(0, Batch([{"k": "a", "v": 7}], [4], [10]), 0))
    assert emitted[1] == ("sums", "late", [{"k": "a", "v": 7}])

    saved = chain.snapshot()
    assert set(saved) == {"has-v", "sums"}
    asyncio.run(chain.push(0, Batch([{"k": "c", "v": 1}], [15], [10]), 0))
    again: list[tuple[str, str, list]] = []
    restored = chain_of(again)
    restored.restore(saved)  # without the record of key c, which came after the snapshot
    asyncio.run(restored.end())
    assert again == []  # nothing open at the snapshot: the window of 0..10 fired before it
    asyncio.run(chain.end())
    assert emitted[2] == ("sums", "main", [{"key": "c", "start": 10, "end": 20, "value": 1}])
