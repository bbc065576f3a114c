"""A savepoint asked for at the end of a bounded job: taken before the final epoch, or refused.

Found in CI: `nopstream savepoint` answered "the next epoch is a savepoint" while the
sources had finished, and the next epoch was the final one, so no savepoint was ever
kept. The epoch coordinator runs here with its real epoch log, storage and routes;
the tasks are played by the trigger, which ACKs each barrier at once (the moment
between the last source finishing and the final epoch cannot be hit on demand in a
real job).
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from nopstream.checkpoint.epochs import Ack
from nopstream.cluster.leases import LeaseKeeper
from nopstream.cluster.local import LocalBackend
from nopstream.model.load import load_data
from nopstream.node.view.jobview import JobHistory
from nopstream.node.wire import guard
from nopstream.node.wire.coordinator_api import CoordinatorRoutes
from nopstream.plan import compiler
from nopstream.plan.epochs import EpochKind
from tests.conftest import led_coordinator, serving

MODEL = {
    "sources": [{"id": "src", "type": "generator", "config": {"count": 10}}],
    "sinks": [{"id": "out", "type": "file", "inputs": ["src"], "config": {"path": "out"}}],
}


def test_a_savepoint_asked_after_the_sources_finished_comes_before_the_final_epoch_then_none(tmp_path):
    plans = compiler.compile_model(load_data({"jobId": "ending", "parallelism": 2, "model": MODEL}))
    plan = plans.partitioned
    secret = guard.new_secret()

    async def scenario() -> tuple[list[EpochKind], list[int], tuple[int, str]]:
        backend = LocalBackend()
        routes = CoordinatorRoutes(plan.task_ids(), guard.Guard(secret), JobHistory(plan))
        taken: list[EpochKind] = []
        try:
            async with (
                serving(routes) as url,
                aiohttp.ClientSession(headers=guard.headers(secret)) as session,
                LeaseKeeper(backend, 30) as keeper,
            ):

                async def trigger(epoch: int, kind: EpochKind) -> None:  # every task ACKs at once
                    taken.append(kind)
                    for task_id in plan.ack_set:
                        coordinator.ack(task_id, epoch, Ack((), {}, []))

                coordinator = await led_coordinator(
                    plans, backend, keeper, tmp_path / "cp", run=1, trigger=trigger
                )
                routes.lead(coordinator, 1, recoveries=0)
                for task_id in plan.source_task_ids():
                    coordinator.source_finished(task_id)
                async with session.post(f"{url}/savepoint") as asked:
                    assert asked.status == 200, await asked.text()
                await coordinator.run()
                async with session.post(f"{url}/savepoint") as late:
                    refused = (late.status, await late.text())
        finally:
            await backend.close()
        return taken, coordinator.savepoints, refused

    taken, savepoints, refused = asyncio.run(scenario())
    assert taken == [EpochKind.SAVEPOINT, EpochKind.FINAL]
    assert savepoints == [1]
    manifests = sorted((tmp_path / "cp" / "checkpoint" / "ending" / "main").glob("*/_manifest.json"))
    assert [json.loads(m.read_text())["kind"] for m in manifests] == ["savepoint", "final"]
    assert refused == (409, "the job is finishing: no savepoint can follow its final epoch")


def test_a_savepoint_and_the_final_epoch_are_triggered_at_once_not_at_the_next_interval(tmp_path):
    """The wait between epochs ends when it must: a job's end waited up to 50 ms for a poll.

    Each of the two is asked for mid-interval (a minute long) and must be triggered
    within 20 ms; the 50 ms poll this replaces took about 40 ms for each here.
    """
    model = {"jobId": "prompt", "parallelism": 2, "checkpoint": {"intervalMs": 60_000}, "model": MODEL}
    plans = compiler.compile_model(load_data(model))
    plan = plans.partitioned

    async def scenario() -> list[tuple[EpochKind, float]]:
        backend = LocalBackend()
        taken: list[tuple[EpochKind, float]] = []
        try:
            async with LeaseKeeper(backend, 30) as keeper:

                async def trigger(epoch: int, kind: EpochKind) -> None:  # every task ACKs at once
                    taken.append((kind, time.monotonic()))
                    for task_id in plan.ack_set:
                        coordinator.ack(task_id, epoch, Ack((), {}, []))

                coordinator = await led_coordinator(
                    plans, backend, keeper, tmp_path / "cp", run=1, trigger=trigger
                )
                running = asyncio.create_task(coordinator.run())
                await asyncio.sleep(0.21)  # off any 50 ms beat of the wait's start
                asked = time.monotonic()
                coordinator.request_savepoint()
                while not taken:
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0.21)
                finished = time.monotonic()
                for task_id in plan.source_task_ids():
                    coordinator.source_finished(task_id)
                await asyncio.wait_for(running, 10)
        finally:
            await backend.close()
        return [(taken[0][0], taken[0][1] - asked), (taken[1][0], taken[1][1] - finished)]

    (savepoint, after_ask), (final, after_finish) = asyncio.run(scenario())
    assert (savepoint, final) == (EpochKind.SAVEPOINT, EpochKind.FINAL)
    assert after_ask < 0.02, f"the savepoint was triggered {after_ask * 1000:.0f} ms after it was asked for"
    assert after_finish < 0.02, f"the final epoch came {after_finish * 1000:.0f} ms after the sources ended"


def test_a_coordinator_cancelled_as_its_last_source_finishes_stops(tmp_path):
    """Found in a CI dry run: a run whose task failed as the other source finished hung.

    The wait between epochs used `asyncio.wait_for`, which on Python 3.11 loses a
    cancellation that comes as the awaited event is set: the coordinator went on
    waiting and its run's task group waited for it forever. Here the last source
    finishes and the coordinator is cancelled at once, with 0 to 3 turns of the event
    loop between the two; each time it must stop.
    """
    model = {"jobId": "cancelled", "parallelism": 2, "checkpoint": {"intervalMs": 60_000}, "model": MODEL}
    plans = compiler.compile_model(load_data(model))
    sources = plans.partitioned.source_task_ids()

    async def scenario(turns: int) -> bool:
        backend = LocalBackend()
        try:
            async with LeaseKeeper(backend, 30) as keeper:
                coordinator = await led_coordinator(plans, backend, keeper, tmp_path / f"cp{turns}", run=1)
                running = asyncio.create_task(coordinator.run())
                await asyncio.sleep(0.07)  # in the wait between epochs
                for task_id in sources:
                    coordinator.source_finished(task_id)
                for _ in range(turns):
                    await asyncio.sleep(0)
                running.cancel()
                done, _ = await asyncio.wait({running}, timeout=2)
                return bool(done) and running.cancelled()
        finally:
            await backend.close()

    assert [asyncio.run(scenario(turns)) for turns in range(4)] == [True] * 4
