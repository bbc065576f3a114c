"""Tasks refuse coordinator commands of another run or with a lower fencing token (over real HTTP)."""

from __future__ import annotations

import asyncio

import aiohttp

from nopstream.model.load import load_data
from nopstream.node.taskserver import TaskIdentity, TaskServer, build_task
from nopstream.plan import compiler

MODEL = {
    "sources": [{"id": "src", "type": "generator", "config": {"kind": "sequence", "count": 10}}],
    "sinks": [{"id": "out", "type": "file", "inputs": ["src"], "config": {"path": "out"}}],
}
S3 = {"storage": {"s3": {"endpoint": "http://s3:9000", "bucket": "cp"}}}


def test_a_task_refuses_commands_of_a_deposed_coordinator_or_another_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plans = compiler.compile_model(load_data({"jobId": "gate", "model": MODEL}), backend="local")
    (task_id,) = plans.partitioned.task_ids()

    async def scenario() -> tuple[list[tuple[int, str]], str]:
        async with aiohttp.ClientSession() as session:

            async def nowhere(task: str) -> str:
                raise AssertionError("no channel is resolved in this test")

            async def send(path: str, body: dict) -> None:
                return None

            task, receiver, listener = build_task(
                plans.partitioned,
                plans.deployment,
                TaskIdentity(task_id, 7, "a1"),
                session=session,
                resolve=nowhere,
                send=send,
            )
            server = TaskServer(task, receiver, listener, run=7)
            url = await server.start("127.0.0.1", 0)
            answers = []
            try:
                for body in (
                    {"epoch": 1, "run": 7, "token": 40},  # the leader
                    {"epoch": 2, "run": 7, "token": 12},  # a deposed coordinator
                    {"epoch": 2, "run": 6, "token": 40},  # the old run
                    {"epoch": 2, "run": 7, "token": 55},  # a newer leader
                ):
                    async with session.post(f"{url}/control/barrier", json=body) as resp:
                        answers.append((resp.status, await resp.text()))
                async with session.get(f"{url}/metrics") as resp:
                    metrics = await resp.text()
            finally:
                await server.close()
            return answers, metrics

    answers, metrics = asyncio.run(scenario())
    assert [status for status, _ in answers] == [200, 409, 409, 200]
    assert answers[1][1] == "barrier refused: token 12 < 40 (a deposed coordinator)"
    assert answers[2][1] == "barrier of run 6 refused: this task is in run 7"
    assert f'nopstream_task_refused_commands_total{{task="{task_id}"}} 2.0' in metrics


def test_task_and_coordinator_name_the_missing_or_bad_variable(nopstream, tmp_path):
    env = {"NOPSTREAM_PLAN_DIR": "", "NOPSTREAM_ETCD": "", "NOPSTREAM_ATTEMPT": ""}
    result = nopstream("coordinator", env=env)
    assert (result.code, result.err) == (
        2,
        "nopstream coordinator: NOPSTREAM_PLAN_DIR is not set (required)\n",
    )
    result = nopstream("task", env={**env, "NOPSTREAM_PLAN_DIR": str(tmp_path)})
    assert (result.code, result.err) == (
        2,
        f"nopstream task: NOPSTREAM_PLAN_DIR={tmp_path}: partitioned.json is missing\n",
    )
    plans = compiler.compile_model(
        load_data({"jobId": "env", "checkpoint": S3, "model": MODEL}), backend="kubernetes"
    )
    (tmp_path / "partitioned.json").write_text(compiler.dump_document(plans.partitioned))
    (tmp_path / "deployment.json").write_text(compiler.dump_document(plans.deployment))
    good = {"NOPSTREAM_PLAN_DIR": str(tmp_path), "NOPSTREAM_ETCD": "etcd:2379", "NOPSTREAM_ATTEMPT": "pod-1"}
    result = nopstream("task", env={**good, "NOPSTREAM_TASK_ID": "env/main/src/0", "NOPSTREAM_RUN": "one"})
    assert (result.code, result.err) == (2, "nopstream task: NOPSTREAM_RUN='one' is not an integer\n")
    result = nopstream(
        "task", env={**good, "NOPSTREAM_ETCD": "etcd", "NOPSTREAM_TASK_ID": "x", "NOPSTREAM_RUN": "1"}
    )
    assert (result.code, result.err) == (2, "nopstream task: NOPSTREAM_ETCD='etcd' must be host:port\n")
