"""A final epoch whose ACKs straddle its timeout still completes; a checkpoint's is aborted.

Found by an adversary: a bounded job (300,000 keys, `emit: final`, `timeoutMs: 400`)
logged "epoch 1 timed out waiting for 4 ACKs" every 400 ms for ever, its output left
staged: the retry of the final epoch began with no ACKs, and tasks never ACK a barrier
twice. The epoch coordinator runs here with its real epoch log and storage; the tasks
are played by the trigger, which ACKs each barrier once, as tasks do: every task at
once but the last, whose ACK comes after two and a half timeouts (a slow disk).
"""

from __future__ import annotations

import asyncio
import json

from nopstream.checkpoint.epochs import Ack
from nopstream.cluster.epochlog import EpochLog
from nopstream.cluster.layout import Layout
from nopstream.cluster.leases import LeaseKeeper
from nopstream.cluster.local import LocalBackend
from nopstream.model.load import load_data
from nopstream.plan import compiler
from nopstream.plan.epochs import EpochKind, EpochState
from tests.conftest import led_coordinator

MODEL = {
    "sources": [{"id": "src", "type": "generator", "config": {"count": 10}}],
    "sinks": [{"id": "out", "type": "file", "inputs": ["src"], "config": {"path": "out"}}],
}
TIMEOUT_MS = 100
LATE_S = 2.5 * TIMEOUT_MS / 1000


def _scenario(tmp_path, *, finished: bool) -> tuple[list[tuple[int, EpochKind]], list[tuple[int, str]], int]:
    """Run the coordinator until its first epoch ends; (triggered, epoch log, aborted count)."""
    checkpoint = {"intervalMs": 10, "timeoutMs": TIMEOUT_MS}
    model = {"jobId": "slow", "parallelism": 2, "checkpoint": checkpoint, "model": MODEL}
    plans = compiler.compile_model(load_data(model))
    plan = plans.partitioned
    *fast, slow = plan.ack_set

    async def scenario() -> tuple[list[tuple[int, EpochKind]], list[tuple[int, str]], int]:
        backend = LocalBackend()
        triggered: list[tuple[int, EpochKind]] = []
        late: list[asyncio.Task[None]] = []
        try:
            async with LeaseKeeper(backend, 30) as keeper:

                async def ack_late(epoch: int) -> None:
                    await asyncio.sleep(LATE_S)
                    coordinator.ack(slow, epoch, Ack((), {}, []))

                async def trigger(epoch: int, kind: EpochKind) -> None:
                    if any(e == epoch for e, _ in triggered):
                        return  # a task never ACKs a barrier twice
                    triggered.append((epoch, kind))
                    for task_id in fast:
                        coordinator.ack(task_id, epoch, Ack((), {}, []))
                    late.append(asyncio.create_task(ack_late(epoch)))

                coordinator = await led_coordinator(
                    plans, backend, keeper, tmp_path / "cp", run=1, trigger=trigger
                )
                if finished:
                    for task_id in plan.source_task_ids():
                        coordinator.source_finished(task_id)
                    async with asyncio.timeout(10 * LATE_S):  # it hung for ever before
                        await coordinator.run()
                else:
                    running = asyncio.create_task(coordinator.run())
                    while coordinator.aborted_count + coordinator.durable_count == 0:
                        await asyncio.sleep(0.01)
                    running.cancel()
                    await asyncio.gather(running, *late, return_exceptions=True)
                layout = Layout("local", "slow", "main")
                entries = await EpochLog(backend, layout).entries()
        finally:
            await backend.close()
        return triggered, [(e.epoch, e.state.value) for e in entries], coordinator.aborted_count

    return asyncio.run(scenario())


def test_a_final_epoch_whose_acks_straddle_its_timeout_completes(tmp_path):
    triggered, entries, aborted = _scenario(tmp_path, finished=True)
    assert triggered == [(1, EpochKind.FINAL)]
    assert entries == [(1, EpochState.COMMITTED.value)]
    assert aborted == 0
    manifest = json.loads(
        (tmp_path / "cp" / "checkpoint" / "slow" / "main" / "1" / "_manifest.json").read_text()
    )
    assert manifest["kind"] == "final"


def test_a_checkpoint_whose_acks_straddle_its_timeout_is_aborted(tmp_path):
    triggered, entries, aborted = _scenario(tmp_path, finished=False)
    assert triggered == [(1, EpochKind.CHECKPOINT)]
    assert entries[0] == (1, EpochState.ABORTED.value)
    assert aborted == 1
    assert not (tmp_path / "cp" / "checkpoint" / "slow" / "main" / "1" / "_manifest.json").exists()
