"""A snapshot is written in the background: the barrier goes on and records flow meanwhile.

The listener here holds a task's write of an epoch until the test releases it (as a
slow disk or object store would), so what the task does during the write is seen:
the barrier reaches the next task, the source goes on reading, the next epoch's
write waits for this one, the task does not finish before its writes are done, and a
failed write fails the task with nothing reported after it.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

from nopstream.local import inprocess
from nopstream.model.load import load_data
from nopstream.plan import compiler
from nopstream.plan.epochs import EpochKind
from nopstream.records import TaskSnapshot
from nopstream.runtime.pacing import TaskSettings
from nopstream.runtime.task import Task

SOURCE, COUNT = "held/main/n/0", "held/main/count/0"


class HeldWrites:
    """Records each write's start and end; holds the writes it is told to, or fails them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.held: dict[tuple[str, int], asyncio.Event] = {}
        self.failing: set[tuple[str, int]] = set()
        self.finished = asyncio.Event()

    async def on_snapshot(self, task: Task, epoch: int, kind: EpochKind, state: TaskSnapshot) -> None:
        self.calls.append(("start", task.task_id, epoch))
        if (task.task_id, epoch) in self.failing:
            raise OSError(f"no space left writing epoch {epoch}")
        if (task.task_id, epoch) in self.held:
            await self.held[(task.task_id, epoch)].wait()
        self.calls.append(("end", task.task_id, epoch))
        if kind == EpochKind.FINAL:
            await task.commit(epoch)

    async def on_source_finished(self, task: Task) -> None:
        self.finished.set()


def tasks_of(tmp_path, monkeypatch, listener: HeldWrites) -> dict[str, Task]:
    """A generator into a keyed count (its own task) into stdout, in process."""
    (tmp_path / "heldfns.py").write_text(textwrap.dedent("def tenth(i):\n    return i % 10\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("heldfns", None)
    model = {
        "jobId": "held",
        "parallelism": 1,
        "semanticMode": "AT_LEAST_ONCE",  # stdout: the writes, not the sink, are under test
        "model": {
            "sources": [{"id": "n", "type": "generator", "config": {"count": 3_000_000}}],
            "operators": [
                {"id": "count", "type": "aggregate", "inputs": ["n"], "key": {"fn": "heldfns:tenth"}}
                | {"aggregate": "count", "combine": False}
            ],
            "sinks": [{"id": "out", "type": "stdout", "inputs": ["count"]}],
        },
    }
    plan = compiler.compile_model(load_data(model), backend="local").partitioned
    tasks = inprocess.build_tasks(plan, listener=listener, settings=TaskSettings(batch_size=100))
    return {t.task_id: t for t in tasks}


async def until(condition, what: str, timeout: float = 30) -> None:
    """Wait for `condition()`; fail naming `what` after `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.002)
    except TimeoutError:
        pytest.fail(f"not within {timeout:g} s: {what}")


def test_the_barrier_goes_on_and_records_flow_while_a_snapshot_is_written(tmp_path, monkeypatch):
    writes = HeldWrites()
    tasks = tasks_of(tmp_path, monkeypatch, writes)
    source, count = tasks[SOURCE], tasks[COUNT]

    async def scenario() -> None:
        for t in tasks.values():
            await t.connect()
        runs = {tid: asyncio.create_task(t.run()) for tid, t in tasks.items()}
        await until(lambda: source.metrics.records_in > 1_000, "the source started")
        writes.held[(SOURCE, 1)] = asyncio.Event()
        source.trigger_barrier(1)
        await until(lambda: ("end", COUNT, 1) in writes.calls, "the count task snapshotted epoch 1")
        assert ("end", SOURCE, 1) not in writes.calls  # the source's own write is still held
        read = source.metrics.records_in
        await until(lambda: source.metrics.records_in > read + 10_000, "the source reads on")

        source.trigger_barrier(2)
        await until(lambda: ("end", COUNT, 2) in writes.calls, "the count task snapshotted epoch 2")
        assert ("start", SOURCE, 2) not in writes.calls, "epoch 2 was written before epoch 1"
        writes.held[(SOURCE, 1)].set()
        await until(lambda: ("end", SOURCE, 2) in writes.calls, "the source wrote epoch 2")
        source_calls = [(what, epoch) for what, tid, epoch in writes.calls if tid == SOURCE]
        assert source_calls == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]

        await asyncio.wait_for(writes.finished.wait(), 60)
        writes.held[(COUNT, 3)] = asyncio.Event()
        source.trigger_barrier(3, EpochKind.FINAL)
        await until(lambda: ("start", COUNT, 3) in writes.calls, "the count task took the final barrier")
        await asyncio.sleep(0.3)
        assert not runs[COUNT].done(), "the task finished before its final snapshot was written"
        writes.held[(COUNT, 3)].set()
        await asyncio.wait_for(asyncio.gather(*runs.values()), 30)

    asyncio.run(scenario())
    assert count.metrics.records_in == 3_000_000


def test_a_failed_write_fails_the_task_and_no_later_epoch_is_reported(tmp_path, monkeypatch):
    writes = HeldWrites()
    tasks = tasks_of(tmp_path, monkeypatch, writes)
    source = tasks[SOURCE]
    writes.failing.add((SOURCE, 1))

    async def scenario() -> None:
        for t in tasks.values():
            await t.connect()
        runs = {tid: asyncio.create_task(t.run()) for tid, t in tasks.items()}
        await until(lambda: source.metrics.records_in > 1_000, "the source started")
        source.trigger_barrier(1)
        source.trigger_barrier(2)
        with pytest.raises(OSError, match=r"no space left writing epoch 1"):
            await asyncio.wait_for(runs[SOURCE], 30)
        runs[COUNT].cancel()
        await asyncio.gather(runs[COUNT], return_exceptions=True)

    asyncio.run(scenario())
    assert [c for c in writes.calls if c[1] == SOURCE] == [("start", SOURCE, 1)]
