"""Tasks refuse coordinator commands of another run or with a lower fencing token (over real HTTP)."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from nopstream.model.load import load_data
from nopstream.node.tasklife import build_task
from nopstream.node.wire import authority, guard
from nopstream.node.wire.messages import TaskIdentity
from nopstream.node.wire.taskserver import TaskServer
from nopstream.plan import compiler
from nopstream.runtime.codec import DEFAULT_CODEC
from nopstream.runtime.frames import Hello, Welcome, decode, encode

MODEL = {
    "sources": [{"id": "src", "type": "generator", "config": {"kind": "sequence", "count": 10}}],
    "sinks": [{"id": "out", "type": "file", "inputs": ["src"], "config": {"path": "out"}}],
}
SECRET = guard.new_secret()
S3 = {"storage": {"s3": {"endpoint": "http://s3:9000", "bucket": "checkpoints"}}}


async def serve_task(
    session: aiohttp.ClientSession, plans: compiler.CompiledPlans, task_id: str, run: int
) -> tuple[TaskServer, str]:
    """One task of the plans served on loopback (no channel of its own is resolved)."""

    async def nowhere(task: str) -> str:
        raise AssertionError("no channel is resolved in this test")

    async def send(path: str, body: dict) -> None:
        return None

    task, receiver, listener = build_task(
        plans.partitioned,
        plans.deployment,
        TaskIdentity(task_id, run, "a1"),
        session=session,
        resolve=nowhere,
        send=send,
    )
    server = TaskServer(task, receiver, listener, run=run, guard=guard.Guard(SECRET))
    return server, await server.start("127.0.0.1", 0)


def test_a_task_refuses_commands_of_a_deposed_coordinator_or_another_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plans = compiler.compile_model(load_data({"jobId": "gate", "model": MODEL}), backend="local")
    (task_id,) = plans.partitioned.task_ids()

    async def scenario() -> tuple[list[tuple[int, str]], str]:
        async with aiohttp.ClientSession(headers=guard.headers(SECRET)) as session:
            server, url = await serve_task(session, plans, task_id, 7)
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
    result = nopstream("coordinator", env={**good, "NOPSTREAM_SECRET_FILE": str(tmp_path / "nope")})
    assert (result.code, result.err) == (
        2,
        f"nopstream coordinator: NOPSTREAM_SECRET_FILE: {tmp_path / 'nope'}: cannot read the job secret"
        " (No such file or directory)\n",
    )
    (tmp_path / "short").write_text("abc\n")
    result = nopstream("coordinator", env={**good, "NOPSTREAM_SECRET_FILE": str(tmp_path / "short")})
    assert (result.code, result.err) == (
        2,
        f"nopstream coordinator: NOPSTREAM_SECRET_FILE: {tmp_path / 'short'}: the job secret must have"
        " at least 32 characters\n",
    )
    guard.write_secret(tmp_path / "secret", SECRET)
    good["NOPSTREAM_SECRET_FILE"] = str(tmp_path / "secret")
    result = nopstream("coordinator", env={**good, "NOPSTREAM_TLS": "true"})
    assert (result.code, result.err) == (
        2,
        f"nopstream coordinator: NOPSTREAM_TLS: {tmp_path / 'ca.crt'}: the job's TLS file is missing\n",
    )
    certificate = authority.issue("env")
    (tmp_path / "ca.crt").write_bytes(certificate.ca)
    (tmp_path / "tls.crt").write_bytes(certificate.cert)
    (tmp_path / "tls.key").write_bytes(authority.issue("another").key)  # a key that is not the certificate's
    result = nopstream("coordinator", env={**good, "NOPSTREAM_TLS": "yes"})
    assert (result.code, result.err) == (
        2,
        "nopstream coordinator: NOPSTREAM_TLS='yes' must be true or false\n",
    )
    result = nopstream("coordinator", env={**good, "NOPSTREAM_TLS": "true"})
    assert result.code == 2 and result.err.startswith(
        f"nopstream coordinator: NOPSTREAM_TLS: {tmp_path / 'tls.crt'}, {tmp_path / 'tls.key'}: not a"
        " certificate and its key ([X509: KEY_VALUES_MISMATCH] key values mismatch"
    ), result.err
    result = nopstream("task", env={**good, "NOPSTREAM_TASK_ID": "env/main/src/0", "NOPSTREAM_RUN": "one"})
    assert (result.code, result.err) == (2, "nopstream task: NOPSTREAM_RUN='one' is not an integer\n")
    result = nopstream(
        "task", env={**good, "NOPSTREAM_ETCD": "etcd", "NOPSTREAM_TASK_ID": "x", "NOPSTREAM_RUN": "1"}
    )
    assert (result.code, result.err) == (2, "nopstream task: NOPSTREAM_ETCD='etcd' must be host:port\n")


def test_a_task_server_closes_at_once_while_an_upstream_channel_is_open(tmp_path, monkeypatch):
    # A task that cannot start exits while upstream tasks hold their channels to it open:
    # its server must not wait for them (aiohttp waits 60 s for open handlers by default).
    monkeypatch.chdir(tmp_path)
    model = {
        "sources": MODEL["sources"],
        "operators": [{"id": "by", "type": "key_by", "inputs": ["src"], "key": {"fn": "builtins:str"}}],
        "sinks": [{**MODEL["sinks"][0], "inputs": ["by"]}],
    }
    plans = compiler.compile_model(load_data({"jobId": "gate", "parallelism": 2, "model": model}))
    plan = plans.partitioned
    edge = plan.edges[0]
    sink = plan.vertex(edge.target_vertex).subtasks[0].task_id
    channel_id = next(edge.channel_id(c) for c in edge.channels if c.downstream == 0)

    async def scenario() -> float:
        async with aiohttp.ClientSession(headers=guard.headers(SECRET)) as session:
            server, url = await serve_task(session, plans, sink, 1)
            ws = await session.ws_connect(f"{url}/channel")
            await ws.send_bytes(encode(Hello("gate", "main", 1, "up", channel_id), DEFAULT_CODEC))
            assert isinstance(decode((await ws.receive()).data, DEFAULT_CODEC), Welcome)
            started = time.monotonic()
            await server.close()
            closed = time.monotonic() - started
            await ws.close()
            return closed

    assert asyncio.run(scenario()) < 3
