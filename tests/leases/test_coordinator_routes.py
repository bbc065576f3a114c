"""The coordinator's routes over real HTTP: a task's message waits (503) until its run is led.

Found by `nopstream chaos` (files -> Kafka on etcd): a source that finished before its
coordinator led the run was told 409 ("stale run 1: the current run is 0"), dropped the
message as obsolete, and the job never took its final epoch. A message of the run led
is taken, one of a newer run waits, only one of an older run is obsolete.
"""

from __future__ import annotations

import asyncio

import aiohttp

from nopstream.cluster.leases import LeaseKeeper
from nopstream.cluster.local import LocalBackend
from nopstream.model.load import load_data
from nopstream.node.view.jobview import JobHistory
from nopstream.node.wire import guard
from nopstream.node.wire.coordinator_api import CoordinatorRoutes
from nopstream.plan import compiler
from tests.conftest import led_coordinator, serving

MODEL = {
    "sources": [{"id": "src", "type": "generator", "config": {"count": 10}}],
    "sinks": [{"id": "out", "type": "file", "inputs": ["src"], "config": {"path": "out"}}],
}


def test_a_message_waits_until_its_run_is_led_and_only_an_older_run_is_obsolete(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plans = compiler.compile_model(load_data({"jobId": "routes", "parallelism": 2, "model": MODEL}))
    plan = plans.partitioned
    source = plan.source_task_ids()[0]
    secret = guard.new_secret()

    async def scenario() -> list[tuple[str, int, str]]:
        backend = LocalBackend()
        routes = CoordinatorRoutes(plan.task_ids(), guard.Guard(secret), JobHistory(plan))
        answers: list[tuple[str, int, str]] = []
        try:
            async with (
                serving(routes) as url,
                aiohttp.ClientSession(headers=guard.headers(secret)) as session,
                LeaseKeeper(backend, 30) as keeper,
            ):

                async def finished(when: str, run: int) -> None:
                    body = {"taskId": source, "run": run}
                    async with session.post(f"{url}/source-finished", json=body) as resp:
                        answers.append((when, resp.status, await resp.text()))

                await finished("before leading", 1)
                coordinator = await led_coordinator(plans, backend, keeper, tmp_path / "cp", run=2)
                routes.lead(coordinator, 2, recoveries=1)
                await finished("newer run", 3)
                await finished("older run", 1)
                assert coordinator.finished_sources == set()
                await finished("the run led", 2)
                assert coordinator.finished_sources == {source}
        finally:
            await backend.close()
        return answers

    assert asyncio.run(scenario()) == [
        ("before leading", 503, "not leading run 1 yet"),
        ("newer run", 503, "not leading run 3 yet"),
        ("older run", 409, "stale run 1: the current run is 2"),
        ("the run led", 200, '{"ok": true}'),
    ]
