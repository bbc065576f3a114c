"""A restored source starts at the read size it had adapted to, not at the configured maximum.

A slow chain shrinks its source's batches (`next_batch_size`); a restore that began
with a full batch again would hold the new run's first barrier, and so its first
output, back by a whole batch of the slow function (seconds on the real node's
recovery bench). The size travels in the task's progress segment.
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
from tests.checkpointing.test_alignment import Snapshots

FNS = """
import time

def slow(i):
    time.sleep(0.001)
    return i
"""
SOURCE = "slow/main/numbers/0"
SETTINGS = TaskSettings(batch_size=200, batch_target_ms=20)


def plan_of(tmp_path, monkeypatch):
    (tmp_path / "readsizefns.py").write_text(textwrap.dedent(FNS))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("readsizefns", None)
    model = {
        "jobId": "slow",
        "parallelism": 1,
        "semanticMode": "AT_LEAST_ONCE",
        "model": {
            "sources": [{"id": "numbers", "type": "generator", "config": {"count": 1_500}}],
            "operators": [{"id": "slow", "type": "map", "inputs": ["numbers"], "fn": "readsizefns:slow"}],
            "sinks": [{"id": "out", "type": "stdout", "inputs": ["slow"]}],
        },
    }
    return compiler.compile_model(load_data(model), backend="local").partitioned


def run(plan, *, restored: TaskSnapshot | None, barrier_after: int) -> tuple[Snapshots, list[int]]:
    """Run the one task (restored from `restored` if given) to its end; its snapshots and read sizes."""
    snapshots = Snapshots()
    (task,) = inprocess.build_tasks(plan, listener=snapshots, settings=SETTINGS)
    if restored is not None:
        task.restore(restored)
    assert task.source is not None
    sizes: list[int] = []
    read = task.source.read

    def recorded(max_records: int):
        sizes.append(max_records)
        return read(max_records)

    task.source.read = recorded  # type: ignore[method-assign]

    async def scenario() -> None:
        await task.connect()
        running = asyncio.create_task(task.run())
        while task.metrics.records_in < barrier_after:
            await asyncio.sleep(0.001)
        task.trigger_barrier(1)
        while SOURCE not in snapshots.finished:
            await asyncio.sleep(0.01)
        task.trigger_barrier(2, "final")
        await running

    asyncio.run(scenario())
    return snapshots, sizes


def test_a_restored_source_starts_at_the_read_size_it_had_adapted_to(tmp_path, monkeypatch):
    plan = plan_of(tmp_path, monkeypatch)
    snapshots, sizes = run(plan, restored=None, barrier_after=400)
    assert sizes[0] == 200  # a fresh source starts at the configured size
    taken = snapshots.taken[(SOURCE, 1)]
    # 1 ms a record against a 20 ms target: about 20 records a batch by the barrier
    assert taken.read_size is not None and taken.read_size <= 40
    stored = TaskSnapshot(taken.operators, taken.source).with_progress(taken.progress())
    assert stored.read_size == taken.read_size  # through the progress segment, as storage keeps it

    _, again = run(plan, restored=stored, barrier_after=0)
    assert again[0] == taken.read_size


def test_a_read_size_from_storage_never_exceeds_the_configured_size(tmp_path, monkeypatch):
    plan = plan_of(tmp_path, monkeypatch)
    (task,) = inprocess.build_tasks(plan, settings=SETTINGS)
    task.restore(TaskSnapshot(operators={}, read_size=5_000))
    assert task.snapshot().read_size == 200
