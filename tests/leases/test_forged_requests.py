"""Forged and replayed requests to a running job are refused with their status and change nothing.

A real job runs (`nopstream run`: its control server and task processes; `nopstream
run --etcd`: coordinator and task processes) while this test, standing in for any
other process on the machine or pod on the cluster, sends every endpoint and data
channel of it requests without the job's secret, with a wrong one, and, with the
secret, with no run or token, an old run, or an old fencing token. Each gets its status
(401, 400, 409 or a refused channel handshake), the refusals are counted in the
metrics, and the job still ends with exactly its input: nothing lost, nothing doubled.
Under `--etcd` the job speaks TLS: a plain-HTTP request, a TLS client presenting another
job's certificate, and one presenting none are refused too (disconnected, or 403).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import yaml

from nopstream.cluster.election import Election
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.registry import Registry
from nopstream.model.load import load_file
from nopstream.node.wire import authority, guard, tls
from nopstream.plan import compiler
from nopstream.runtime.codec import DEFAULT_CODEC
from nopstream.runtime.frames import Hello, Refused, decode, encode
from tests.conftest import ROOT, run_nopstream

COUNT = 6000
WRONG = {"Authorization": "Bearer " + "0" * 64}


def model() -> dict:
    """Integers paced to about six seconds, through a HASH edge (channels), into a file sink."""
    return {
        "jobId": "forged",
        "parallelism": 2,
        "checkpoint": {"intervalMs": 300, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [
                {"id": "numbers", "type": "generator", "config": {"count": COUNT, "ratePerSecond": 1000}}
            ],
            "operators": [{"id": "by-value", "type": "key_by", "key": {"fn": "forgedfns:same"}}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }


def start(home: Path, *args: str) -> subprocess.Popen[str]:
    home.mkdir()
    (home / "forgedfns.py").write_text("def same(x):\n    return x\n")
    (home / "job.yaml").write_text(yaml.safe_dump(model(), sort_keys=False))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(home)])}
    return subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", "--quiet", *args],
        cwd=home,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def output(home: Path) -> Counter[int]:
    return Counter(json.loads(line) for f in (home / "out").glob("*.jsonl") for line in f.read_text().split())


async def status(session: aiohttp.ClientSession, method: str, url: str, **kwargs) -> tuple[int, str]:
    async with session.request(method, url, **kwargs) as resp:
        return resp.status, await resp.text()


async def channel(session: aiohttp.ClientSession, task_url: str, hello: Hello, **kwargs) -> str:
    """How the task answers a channel handshake: `401`, or the reason it refused the HELLO."""
    try:
        ws = await session.ws_connect(f"{task_url}/channel", **kwargs)
    except aiohttp.WSServerHandshakeError as err:
        return str(err.status)
    async with ws:
        await ws.send_bytes(encode(hello, DEFAULT_CODEC))
        answer = decode((await ws.receive()).data, DEFAULT_CODEC)
        assert isinstance(answer, Refused), answer
        return answer.reason


async def forge_task(session: aiohttp.ClientSession, url: str, run: int, secret: str) -> dict[str, object]:
    """Every forged or replayed request to one task: what it answered."""
    ok = guard.headers(secret)
    command = {"epoch": 10**6, "run": run, "token": 0}
    answers: dict[str, object] = {}
    for path in ("/control/barrier", "/control/commit"):
        answers[f"{path} no secret"] = await status(session, "POST", url + path, json=command)
        answers[f"{path} wrong secret"] = await status(
            session, "POST", url + path, json=command, headers=WRONG
        )
        answers[f"{path} no run"] = (
            await status(session, "POST", url + path, json={"epoch": 10**6, "token": 10**9}, headers=ok)
        )[0]
        answers[f"{path} old run"] = (
            await status(session, "POST", url + path, json={**command, "run": run - 1}, headers=ok)
        )[0]
        answers[f"{path} old token"] = (await status(session, "POST", url + path, json=command, headers=ok))[
            0
        ]
    answers["/control/status no secret"] = (await status(session, "GET", url + "/control/status"))[0]
    answers["/healthz"] = await status(session, "GET", url + "/healthz")
    return answers


TASK_ANSWERS = {
    **{
        f"{path} {case}": answer
        for path in ("/control/barrier", "/control/commit")
        for case, answer in (
            ("no secret", (401, "this endpoint needs the job's secret (Authorization: Bearer ...)")),
            ("wrong secret", (401, "this endpoint needs the job's secret (Authorization: Bearer ...)")),
            ("no run", 400),
            ("old run", 409),
            ("old token", 409),
        )
    },
    "/control/status no secret": 401,
    "/healthz": (200, '{"ok": true}'),
}


async def forge_channels(
    session: aiohttp.ClientSession, task_url: str, channel_id: str, run: int, secret: str
) -> list[str]:
    hello = Hello("forged", "main", run, "forger", channel_id)
    return [
        await channel(session, task_url, hello),
        await channel(session, task_url, hello, headers=WRONG),
        await channel(
            session,
            task_url,
            Hello("forged", "main", run - 1, "forger", channel_id),
            headers=guard.headers(secret),
        ),
        await channel(session, task_url, hello, headers=guard.headers(secret)),
    ]


def sink_channel() -> tuple[str, str]:
    """(the first sink task, the id of its first input channel) of the job's plan."""
    plan = compiler.compile_model(load_file(Path("job.yaml"))).partitioned
    sink = next(v for v in plan.vertices if any(op.node_id == "out" for op in v.operators))
    edge = next(e for e in plan.edges if e.target_vertex == sink.vertex_id)
    return plan.vertex(edge.target_vertex).subtasks[0].task_id, edge.channel_id(edge.channels[0])


def test_forged_requests_to_the_local_runner_and_its_tasks_are_refused(tmp_path, monkeypatch):
    home = tmp_path / "job"
    job = start(home)
    monkeypatch.chdir(home)
    run_dir = home / ".nopstream" / "runs" / "forged" / "run-1"
    wait_for(run_dir / "control-url")
    control, secret = (run_dir / "control-url").read_text(), (run_dir / "secret").read_text()
    sink_task, channel_id = sink_channel()
    wait_for(
        home / "cp" / "checkpoint" / "forged" / "main" / "2" / "_manifest.json"
    )  # tasks have seen commands

    async def forge() -> tuple[dict, dict, list, str]:
        ok = guard.headers(secret)
        answers: dict[str, object] = {}
        async with aiohttp.ClientSession() as session:
            for method, path in (
                ("POST", "/register"),
                ("GET", f"/endpoint?task={sink_task}"),
                ("POST", "/stats"),
                ("POST", "/done"),
                ("POST", "/failed"),
                ("GET", "/run"),
                ("POST", "/ack"),
                ("POST", "/source-finished"),
                ("POST", "/savepoint"),
                ("GET", "/api/v1/job"),
            ):
                answers[f"{path} no secret"] = (await status(session, method, control + path, json={}))[0]
                answers[f"{path} wrong secret"] = (
                    await status(session, method, control + path, json={}, headers=WRONG)
                )[0]
            every_source = [
                t for t in compiler.compile_model(load_file(Path("job.yaml"))).partitioned.source_task_ids()
            ]
            for path in ("/done", "/failed", "/source-finished"):
                for task_id in every_source:
                    answers[f"{path} old run {task_id}"] = await status(
                        session, "POST", control + path, json={"taskId": task_id, "run": 0}, headers=ok
                    )
                    answers[f"{path} no run {task_id}"] = (
                        await status(session, "POST", control + path, json={"taskId": task_id}, headers=ok)
                    )[0]
            forged = {"taskId": sink_task, "run": 1, "attempt": "forger", "endpoint": 5}
            answers["/register no endpoint"] = await status(
                session, "POST", control + "/register", json=forged, headers=ok
            )
            async with session.get(f"{control}/endpoint", params={"task": sink_task}, headers=ok) as resp:
                task_url = (await resp.json())["endpoint"]
            tasks = await forge_task(session, task_url, 1, secret)
            channels = await forge_channels(session, task_url, channel_id, 1, secret)
            metrics = (await status(session, "GET", control + "/metrics"))[1]
            task_metrics = (await status(session, "GET", task_url + "/metrics"))[1]
        return answers, tasks, channels, metrics + task_metrics

    answers, tasks, channels, metrics = asyncio.run(forge())
    assert job.wait(60) == 0, job.stderr.read() if job.stderr else ""
    assert output(home) == Counter(range(COUNT))
    assert {k: v for k, v in answers.items() if "secret" in k} == {k: 401 for k in answers if "secret" in k}
    sources = [k.rpartition(" ")[2] for k in answers if k.startswith("/done old run")]
    for path in ("/done", "/failed", "/source-finished"):
        for task_id in sources:
            assert answers[f"{path} old run {task_id}"] == (409, "stale run 0: the current run is 1")
            assert answers[f"{path} no run {task_id}"] == 400
    assert answers["/register no endpoint"] == (400, "endpoint of a registration is a string, not 5")
    assert tasks == TASK_ANSWERS
    assert channels[:2] == ["401", "401"]
    assert channels[2] == "stale run 0 of attempt forger: the current run is 1"
    assert channels[3] == f"channel {channel_id} is already connected"
    assert "nopstream_unauthorized_requests_total 20.0" in metrics  # the control server's
    assert metrics.count("nopstream_unauthorized_requests_total 7.0") == 1  # the sink task's


def test_forged_requests_to_the_coordinators_and_tasks_on_etcd_are_refused(
    tmp_path, monkeypatch, etcd_server
):
    host, port = etcd_server.endpoint
    home = tmp_path / "job"
    job = start(home, "--etcd", f"{host}:{port}")
    monkeypatch.chdir(home)
    files = home / ".nopstream" / "runs" / "forged" / "cluster"
    wait_for(files / "secret")
    secret = (files / "secret").read_text()
    sink_task, channel_id = sink_channel()
    wait_for(home / "cp" / "checkpoint" / "forged" / "main" / "2" / "_manifest.json")

    async def endpoints() -> tuple[str, int, str]:
        backend = EtcdBackend(host, port)
        try:
            layout = Layout("local", "forged", "main")
            run = await Registry(backend, layout).current_run()
            leader = await Election(backend, layout, "test").leader_endpoint()
            tasks = await Registry(backend, layout).tasks(run)
            assert leader is not None
            return leader, run, tasks[sink_task].endpoint
        finally:
            await backend.close()

    async def forge() -> tuple[dict, dict, dict, list, str, int, str]:
        leader, run, task_url = await endpoints()
        assert leader.startswith("https://") and task_url.startswith("https://"), (leader, task_url)
        ok = guard.headers(secret)
        answers: dict[str, object] = {}
        targets = {
            "leader /ack": ("POST", leader + "/ack"),
            "leader /api/v1/job": ("GET", leader + "/api/v1/job"),
            "task /control/status": ("GET", task_url + "/control/status"),
        }
        outsiders = await forge_without_the_certificate(
            targets, secret, files / tls.CA_FILE, tmp_path / "other"
        )
        # a process with the job's files: the job's certificate, and what it sends checked still
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=tls.JobTls(files).client_context())
        ) as session:
            for path in ("/ack", "/source-finished", "/savepoint"):
                answers[f"{path} no secret"] = (await status(session, "POST", leader + path, json={}))[0]
                answers[f"{path} wrong secret"] = (
                    await status(session, "POST", leader + path, json={}, headers=WRONG)
                )[0]
            for path in ("/ack", "/source-finished"):
                body = {"taskId": "forged/main/numbers/0", "epoch": 1, "segments": {}}
                answers[f"{path} old run"] = await status(
                    session, "POST", leader + path, json={**body, "run": run - 1}, headers=ok
                )
                answers[f"{path} no run"] = (
                    await status(session, "POST", leader + path, json=body, headers=ok)
                )[0]
            answers["/healthz"] = await status(session, "GET", leader + "/healthz")
            tasks = await forge_task(session, task_url, run, secret)
            channels = await forge_channels(session, task_url, channel_id, run, secret)
            metrics = (await status(session, "GET", leader + "/metrics"))[1]
        return answers, outsiders, tasks, channels, metrics, run, leader

    answers, outsiders, tasks, channels, metrics, run, leader = asyncio.run(forge())
    # the job's own command asks with the secret `nopstream run --etcd` keeps; another secret gets 401
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(home)])}
    savepoint = ["savepoint", "job.yaml", "--etcd", f"{host}:{port}"]
    asked = run_nopstream(*savepoint, cwd=home, env=env)
    assert asked.code == 0 and asked.out.startswith("savepoint requested: the next epoch of job 'forged'"), (
        asked
    )
    (home / "wrong").mkdir()  # the job's TLS files with another secret
    for name in tls.FILES:
        shutil.copy(files / name, home / "wrong" / name)
    (home / "wrong" / "secret").write_text("1" * 64)
    wrong = run_nopstream(*savepoint, "--secret-file", "wrong/secret", cwd=home, env=env)
    assert (wrong.code, wrong.err) == (
        1,
        f"job 'forged': the coordinator at {leader} refused /savepoint (401):"
        " this endpoint needs the job's secret (Authorization: Bearer ...)\n",
    )
    assert job.wait(90) == 0, job.stderr.read() if job.stderr else ""
    assert output(home) == Counter(range(COUNT))
    assert answers == {
        **{
            f"{p} {c}": 401
            for p in ("/ack", "/source-finished", "/savepoint")
            for c in ("no secret", "wrong secret")
        },
        **{
            f"{p} old run": (409, f"stale run {run - 1}: the current run is {run}")
            for p in ("/ack", "/source-finished")
        },
        **{f"{p} no run": 400 for p in ("/ack", "/source-finished")},
        "/healthz": (200, '{"ok": true}'),
    }
    assert tasks == TASK_ANSWERS
    assert channels[:2] == ["401", "401"]
    assert channels[2] == f"stale run {run - 1} of attempt forger: the current run is {run}"
    assert channels[3] == f"channel {channel_id} is already connected"
    assert outsiders == OUTSIDERS
    assert "nopstream_unauthorized_requests_total 7.0" in metrics  # and the 403 of /ack without a certificate


def tls_context(ca: Path | None, certificate: tls.JobTls | None) -> ssl.SSLContext:
    """A client trusting the job's CA (its certificate is no secret; None: trusting any server),
    presenting `certificate`'s."""
    context = ssl.create_default_context(cafile=None if ca is None else str(ca))
    context.check_hostname = False
    if ca is None:
        context.verify_mode = ssl.CERT_NONE
    if certificate is not None:
        directory = certificate.directory
        context.load_cert_chain(str(directory / tls.CERT_FILE), str(directory / tls.KEY_FILE))
    return context


async def forge_without_the_certificate(
    targets: dict[str, tuple[str, str]], secret: str, ca: Path | None, other: Path
) -> dict[str, object]:
    """What the job's servers (their CA `ca`) answer at `targets` (name: method, https URL) clients
    without the job's certificate, each sending `secret`; another job's TLS files are made in `other`."""
    other.mkdir()
    stranger = authority.issue("another-job").write(other)  # another job's: its CA is not this job's
    answers: dict[str, object] = {}
    clients = {
        "plain http": None,
        "no certificate": tls_context(ca, None),
        "another job's certificate": tls_context(ca, stranger),
    }
    for who, context in clients.items():
        connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
        async with aiohttp.ClientSession(connector=connector, headers=guard.headers(secret)) as session:
            for name, (method, url) in targets.items():
                if context is None:
                    url = url.replace("https://", "http://", 1)
                try:
                    async with session.request(method, url, json={}) as resp:
                        answers[f"{who}: {name}"] = resp.status
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                    # the server closed the connection: no TLS, or a certificate it refused (a reset
                    # when the alert crosses the request)
                    answers[f"{who}: {name}"] = "disconnected"
    return answers


OUTSIDERS = {
    **{
        f"{who}: {name}": "disconnected"
        for who in ("plain http", "another job's certificate")
        for name in ("leader /ack", "leader /api/v1/job", "task /control/status")
    },
    # the dashboard's API admits the secret alone (people's browsers have no certificate)
    "no certificate: leader /ack": 403,
    "no certificate: leader /api/v1/job": 200,
    "no certificate: task /control/status": 403,
}
