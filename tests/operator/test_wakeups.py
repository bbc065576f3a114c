"""A lost pod or node starts its job's next pass at once; other pod changes wait for the periodic pass."""

from __future__ import annotations

import asyncio
import time

from nopstream_operator.nodes import LostNodes
from nopstream_operator.wakeups import Wakeups, is_loss

RUNNING = {
    "metadata": {"name": "wc-count-0-r1", "labels": {"nopstream.io/job": "wc"}},
    "status": {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "task",
                "ready": True,
                "state": {"running": {"startedAt": "2026-12-02T04:00:00Z"}},
                # an earlier restart of the coordinator's container: not a loss now
                "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}},
            }
        ],
    },
}


def with_status(**status) -> dict:
    return {**RUNNING, "status": {**RUNNING["status"], **status}}


def test_what_counts_as_a_lost_pod():
    assert not is_loss("ADDED", RUNNING)
    assert not is_loss("MODIFIED", RUNNING)
    assert not is_loss(None, {"metadata": {"name": "new"}})  # listed before it has a status
    assert not is_loss("MODIFIED", with_status(phase="Pending", containerStatuses=[]))
    assert is_loss("DELETED", RUNNING)
    assert is_loss("MODIFIED", {**RUNNING, "metadata": {**RUNNING["metadata"], "deletionTimestamp": "now"}})
    assert is_loss("MODIFIED", with_status(phase="Failed"))
    assert is_loss("MODIFIED", with_status(phase="Succeeded"))
    killed = {"name": "task", "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}
    assert is_loss("MODIFIED", with_status(containerStatuses=[killed]))


def test_a_wake_cuts_the_wait_short_and_is_consumed():
    async def scenario() -> tuple[bool, float, bool, float]:
        wakeups = Wakeups()
        wakeups.watch("ns", "wc")
        asyncio.get_running_loop().call_later(0.05, wakeups.wake, "ns", "wc")
        start = time.monotonic()
        woken = await wakeups.wait("ns", "wc", 5.0)
        cut = time.monotonic() - start
        start = time.monotonic()
        again = await wakeups.wait("ns", "wc", 0.2)  # the wake was consumed: the full period now
        return woken, cut, again, time.monotonic() - start

    woken, cut, again, full = asyncio.run(scenario())
    assert woken and cut < 1.0
    assert not again and full >= 0.2


def test_a_wake_during_a_pass_is_kept_for_the_next_wait_and_other_jobs_are_not_woken():
    async def scenario() -> tuple[bool, bool]:
        wakeups = Wakeups()
        wakeups.watch("ns", "wc")
        wakeups.watch("ns", "other")
        wakeups.wake("ns", "wc")  # while the daemon was in its pass
        wakeups.wake("ns", "nobody")  # no daemon drives that job here: dropped
        return await wakeups.wait("ns", "wc", 0.01), await wakeups.wait("ns", "other", 0.01)

    assert asyncio.run(scenario()) == (True, False)


def test_a_wake_after_the_daemon_ended_is_not_kept_for_the_next_daemon():
    async def scenario() -> bool:
        wakeups = Wakeups()
        wakeups.watch("ns", "wc")
        wakeups.forget("ns", "wc")  # the job's daemon ended
        wakeups.wake("ns", "wc")  # its pods' deletions arrive after
        wakeups.watch("ns", "wc")  # a job of the same name again
        return await wakeups.wait("ns", "wc", 0.01)

    assert asyncio.run(scenario()) is False


def node(name: str, ready: str | None) -> dict:
    conditions = (
        []
        if ready is None
        else [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]
    )
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def test_a_node_is_lost_while_its_ready_condition_is_not_true_and_only_its_turn_wakes_every_job():
    lost = LostNodes()
    assert not lost.seen("ADDED", node("node-0", None))  # registered, not yet reporting: not lost
    assert not lost.seen("ADDED", node("node-1", "True"))
    assert lost.seen("MODIFIED", node("node-1", "Unknown"))  # missed its lease renewals
    assert not lost.seen("MODIFIED", node("node-1", "Unknown"))  # still lost: no new wake
    assert lost.seen("MODIFIED", node("node-0", "False"))  # the kubelet says it is unwell
    assert lost.names() == {"node-0", "node-1"}
    assert not lost.seen("MODIFIED", node("node-1", "True"))  # back
    assert not lost.seen("DELETED", node("node-0", "False"))  # gone from the cluster: nothing to replace by
    assert lost.names() == frozenset()

    async def scenario() -> tuple[bool, bool]:
        wakeups = Wakeups()
        wakeups.watch("ns", "wc")
        wakeups.watch("other", "wc")
        wakeups.wake_all()
        return await wakeups.wait("ns", "wc", 0.01), await wakeups.wait("other", "wc", 0.01)

    assert asyncio.run(scenario()) == (True, True)


def test_a_new_generation_of_a_job_s_spec_wakes_it_and_its_status_writes_do_not():
    async def scenario() -> list[bool]:
        wakeups = Wakeups()
        wakeups.generation("ns", "wc", 1)  # before its daemon watches: nothing kept
        wakeups.watch("ns", "wc")
        woken = []
        for generation in (1, 1, 2, 2):  # seen first, a status write, a spec change, a status write
            wakeups.generation("ns", "wc", generation)
            woken.append(await wakeups.wait("ns", "wc", 0.01))
        wakeups.generation("ns", "other", 5)  # no daemon drives it here
        return woken

    assert asyncio.run(scenario()) == [True, False, True, False]
