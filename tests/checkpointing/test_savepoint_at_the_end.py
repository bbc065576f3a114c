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

import aiohttp

from nopstream.cluster.leases import LeaseKeeper
from nopstream.cluster.local import LocalBackend
from nopstream.model.load import load_data
from nopstream.node import guard
from nopstream.node.coordinator_api import CoordinatorRoutes
from nopstream.node.epochs import Ack
from nopstream.node.jobview import JobHistory
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
