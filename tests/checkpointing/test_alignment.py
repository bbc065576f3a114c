"""Barrier alignment: the snapshot of a two-input operator holds exactly what preceded the barrier.

Source `fast` floods its channel; source `slow` feeds a deliberately slow map in a
task of its own, so its barrier queues behind a backlog and reaches the joining
operator long after the fast one's. While aligning, the
fast channel must be held back: the joining operator's snapshot at the barrier must
contain exactly the records each source emitted before injecting the barrier (its
cursor, an exclusive cut), none after.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap

from nopstream.local import inprocess
from nopstream.model.load import load_data
from nopstream.plan import compiler
from nopstream.records import TaskSnapshot
from nopstream.runtime.pacing import TaskSettings
from nopstream.runtime.transport import TransportSettings

FNS = """
import time

def tag_fast(i):
    return {"src": "fast", "i": i}

def tag_slow(i):
    time.sleep(0.001)
    return {"src": "slow", "i": i}

class Collect:
    def process(self, r, ctx):
        ctx.list("seen").append(r["i"])
        return []
"""


class Snapshots:
    def __init__(self) -> None:
        self.taken: dict[tuple[str, int], TaskSnapshot] = {}
        self.finished: set[str] = set()

    async def on_snapshot(self, task, epoch: int, kind: str, state: TaskSnapshot) -> None:
        self.taken[(task.task_id, epoch)] = state
        if kind == "final":
            await task.commit(epoch)

    async def on_source_finished(self, task) -> None:
        self.finished.add(task.task_id)


def test_alignment_holds_back_the_fast_channel(tmp_path, monkeypatch):
    (tmp_path / "alignfns.py").write_text(textwrap.dedent(FNS).replace("jobfns", "alignfns"))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("alignfns", None)
    model = {
        "jobId": "align",
        "parallelism": 1,
        "semanticMode": "AT_LEAST_ONCE",
        "model": {
            "sources": [
                {"id": "fast", "type": "generator", "config": {"count": 400_000}},
                {"id": "slow", "type": "generator", "config": {"count": 3_000}},
            ],
            "operators": [
                {"id": "tag-fast", "type": "map", "inputs": ["fast"], "fn": "alignfns:tag_fast"},
                # its own task (rebalance breaks the chain), so the slow barrier queues behind its records
                {
                    "id": "tag-slow",
                    "type": "map",
                    "inputs": ["slow"],
                    "fn": "alignfns:tag_slow",
                    "partitioning": "rebalance",
                },
                {
                    "id": "collect",
                    "type": "process",
                    "inputs": ["tag-fast", "tag-slow"],
                    "key": {"field": "src"},
                    "fn": "alignfns:Collect",
                },
            ],
            "sinks": [{"id": "out", "type": "stdout", "inputs": ["collect"]}],
        },
    }
    plan = compiler.compile_model(load_data(model), backend="local").partitioned
    snapshots = Snapshots()
    # small batches and a small credit window (in records): the slow path's backlog, and
    # so the time its barrier takes, stays short, and a blocked channel soon stalls its sender
    tasks = inprocess.build_tasks(
        plan,
        listener=snapshots,
        settings=TaskSettings(batch_size=100),
        transport=TransportSettings(window=300, grant_interval=100),
    )
    by_id = {t.task_id: t for t in tasks}

    async def scenario():
        for t in tasks:
            await t.connect()
        runs = [asyncio.create_task(t.run(), name=t.task_id) for t in tasks]
        while by_id["align/main/fast/0"].metrics.records_in < 2_000:
            await asyncio.sleep(0.001)
        by_id["align/main/fast/0"].trigger_barrier(1)
        by_id["align/main/slow/0"].trigger_barrier(1)
        while len(snapshots.finished) < 2:  # both sources read everything: the final barrier
            await asyncio.sleep(0.01)
        by_id["align/main/fast/0"].trigger_barrier(2, "final")
        by_id["align/main/slow/0"].trigger_barrier(2, "final")
        await asyncio.gather(*runs)

    asyncio.run(scenario())
    fast_cut = snapshots.taken[("align/main/fast/0", 1)].source["cursors"]["split-0"]
    slow_cut = snapshots.taken[("align/main/slow/0", 1)].source["cursors"]["split-0"]
    joined = snapshots.taken[("align/main/collect/0", 1)].operators["collect"]["keyed"]
    seen = {key: state["seen"] for shard in joined.values() for key, state in shard["state"]}
    assert 0 < fast_cut < 400_000 and 0 < slow_cut < 3_000
    assert seen["fast"] == list(range(fast_cut)), "records after the fast barrier reached the snapshot"
    assert seen["slow"] == list(range(slow_cut))
    collect = by_id["align/main/collect/0"]
    fast_channel = next(c for c in collect.gate.channels if c.edge_id == "tag-fast->collect")
    # the fast channel really was held back: its sender filled the window during alignment
    assert fast_channel.max_buffered_units >= 300 - 101  # the window, less at most one frame of 101 units
