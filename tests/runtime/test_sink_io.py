"""Sink I/O runs off the task's event loop: a stalled storage server holds a commit, not the task.

The stall is real: the session's MinIO server is stopped with SIGSTOP while a sink
publishes its transaction (COPY, DELETE), so the requests wait on a live socket that
answers nothing, as they would on an overloaded or partitioned S3 endpoint. A timer
sends SIGCONT whatever happens, so the server is never left stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from nopstream.local import inprocess
from nopstream.model.load import load_data
from nopstream.plan import compiler
from nopstream.plan.epochs import EpochKind
from nopstream.records import SinkStart, TaskSnapshot
from nopstream.runtime.pacing import TaskSettings
from nopstream.runtime.sink_calls import SinkStuck
from tests.conftest import s3_records

RECORDS = 2_000
STALL = 2.0  # seconds MinIO stays stopped


class Listener:
    def __init__(self) -> None:
        self.snapshots: dict[int, TaskSnapshot] = {}
        self.finished = asyncio.Event()

    async def on_snapshot(self, task, epoch: int, kind: EpochKind, state: TaskSnapshot) -> None:
        self.snapshots[epoch] = state

    async def on_source_finished(self, task) -> None:
        self.finished.set()


def stalled_job(minio_server, bucket, monkeypatch, settings: TaskSettings | None = None):
    """A generator into an s3 sink, chained into one task; the task and what it snapshots."""
    monkeypatch.setenv("NOPSTREAM_S3_ACCESS_KEY", minio_server.access_key)
    monkeypatch.setenv("NOPSTREAM_S3_SECRET_KEY", minio_server.secret_key)
    model = {
        "jobId": "stall",
        "parallelism": 1,
        "model": {
            "sources": [{"id": "n", "type": "generator", "config": {"count": RECORDS}}],
            "sinks": [
                {
                    "id": "out",
                    "type": "s3",
                    "inputs": ["n"],
                    "config": {"endpoint": minio_server.url, "bucket": bucket, "prefix": "out/"},
                }
            ],
        },
    }
    plan = compiler.compile_model(load_data(model), backend="local").partitioned
    listener = Listener()
    (task,) = inprocess.build_tasks(plan, listener=listener, settings=settings)
    return task, listener


@contextlib.contextmanager
def stopped(server) -> Iterator[None]:
    """The server stopped with SIGSTOP; a timer sends SIGCONT after `STALL` seconds whatever happens."""
    os.kill(server.process.pid, signal.SIGSTOP)
    resume = threading.Timer(STALL, os.kill, (server.process.pid, signal.SIGCONT))
    resume.start()
    try:
        yield
    finally:
        resume.join()


async def until_final_snapshot(task, listener: Listener):
    """Start the task and take its final barrier: its transaction is staged (PUT) and pending."""
    await task.recover(SinkStart(None))
    await task.connect()
    run = asyncio.create_task(task.run())
    await listener.finished.wait()
    task.trigger_barrier(1, EpochKind.FINAL)
    while 1 not in listener.snapshots:
        await asyncio.sleep(0.01)
    return run


def test_a_commit_stalled_by_the_object_store_leaves_the_event_loop_running(
    minio_server, minio_client, bucket, monkeypatch
):
    task, listener = stalled_job(minio_server, bucket, monkeypatch)
    gaps: list[float] = []

    async def scenario() -> float:
        run = await until_final_snapshot(task, listener)
        with stopped(minio_server):
            stalled = time.monotonic()
            commit = asyncio.create_task(task.commit(1))
            while time.monotonic() - stalled < STALL / 2:
                before = time.monotonic()
                await asyncio.sleep(0.01)
                gaps.append(time.monotonic() - before)
            assert not commit.done(), "the commit finished while the object store was stopped"
            await asyncio.wait_for(commit, 60)
            await asyncio.wait_for(run, 10)
            return time.monotonic() - stalled

    took = asyncio.run(scenario())
    assert took >= STALL * 0.9, f"the commit took {took:.2f}s: it never waited for the stopped server"
    assert max(gaps) < 0.25, f"the event loop was held for {max(gaps):.2f}s by a stalled commit"
    assert len(gaps) > 20
    assert s3_records(minio_client, bucket, "out/") == Counter(str(i) for i in range(RECORDS))
    assert [t.records for t in listener.snapshots[1].pending_transactions()] == [RECORDS]


def test_a_sink_call_that_does_not_return_fails_the_task(minio_server, minio_client, bucket, monkeypatch):
    task, listener = stalled_job(minio_server, bucket, monkeypatch, TaskSettings(sink_call_s=0.5))

    async def scenario() -> None:
        run = await until_final_snapshot(task, listener)
        with stopped(minio_server):
            with pytest.raises(SinkStuck, match=r"stall/main/n/0: a sink call did not return within 0.5 s"):
                await task.commit(1)
            with pytest.raises(SinkStuck):  # the task fails with it: its job recovers
                await asyncio.wait_for(run, 10)

    asyncio.run(scenario())


def test_a_source_whose_origin_cannot_be_told_an_epoch_is_durable_fails_the_task(
    minio_server, bucket, monkeypatch
):
    """A CDC source lets its replication slot go at each commit; a connection the server closed made
    every commit command fail with the same error while the task ran on, and the coordinator asked
    for ever (a chaos cell's job never finished). The task fails instead, and its job recovers."""
    task, listener = stalled_job(minio_server, bucket, monkeypatch)

    def durable(epoch: int) -> None:
        raise ConnectionError(f"the connection is closed (epoch {epoch})")

    monkeypatch.setattr(task.source, "snapshotted", lambda epoch: None, raising=False)
    monkeypatch.setattr(task.source, "durable", durable, raising=False)

    async def scenario() -> None:
        run = await until_final_snapshot(task, listener)
        with pytest.raises(ConnectionError, match="epoch 1"):
            await task.commit(1)
        with pytest.raises(ConnectionError, match="epoch 1"):  # the task fails with it: its job recovers
            await asyncio.wait_for(run, 10)

    asyncio.run(scenario())
