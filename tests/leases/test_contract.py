"""The coordination contract, run against the local backend and a real etcd server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

from nopstream.cluster.backend import LeaseExpired
from nopstream.cluster.election import Election
from nopstream.cluster.epochlog import EpochLog
from nopstream.cluster.errors import Fenced
from nopstream.cluster.fencing import TokenGate
from nopstream.cluster.leases import LeaseKeeper
from nopstream.cluster.local import LocalBackend
from nopstream.cluster.registry import Change, Registration, Registry
from nopstream.plan.epochs import EpochState


def test_revisions_and_conditional_writes(backend_factory, layout, run_async):
    async def scenario(b):
        key = layout.prefix + "k"
        r1 = await b.put(key, b"one")
        r2 = await b.put(key, b"two")
        assert r2 > r1
        entry = await b.get(key)
        assert (entry.value, entry.create_revision, entry.mod_revision) == (b"two", r1, r2)
        assert await b.create(key, b"again") is None
        created = await b.create(layout.prefix + "new", b"x")
        assert created == (await b.get(layout.prefix + "new")).create_revision
        assert await b.compare_and_swap(key, b"one", b"three") is False
        assert await b.compare_and_swap(key, b"two", b"three") is True
        assert await b.compare_and_swap(layout.prefix + "absent", None, b"1") is True
        assert await b.compare_and_swap(layout.prefix + "absent", None, b"2") is False
        # `also` is written in the same transaction: with the swap, or not at all
        also = {layout.prefix + "with": b"w"}
        assert await b.compare_and_swap(key, b"two", b"four", also=also) is False
        assert await b.get(layout.prefix + "with") is None
        assert await b.compare_and_swap(key, b"three", b"four", also=also) is True
        assert (await b.get(key)).value == b"four" and (await b.get(layout.prefix + "with")).value == b"w"
        assert sorted(await b.get_prefix(layout.prefix)) == [
            layout.prefix + k for k in ("absent", "k", "new", "with")
        ]
        assert await b.delete(key) is True and await b.get(key) is None
        assert await b.revision() >= created

    run_async(backend_factory, scenario)


def test_keys_of_a_lease_go_with_it(backend_factory, layout, run_async):
    async def scenario(b):
        lease = await b.grant(2)
        await b.put(layout.prefix + "held", b"1", lease=lease)
        await b.refresh(lease)
        await b.revoke(lease)
        assert await b.get(layout.prefix + "held") is None
        with pytest.raises(LeaseExpired):
            await b.refresh(lease)
        short = await b.grant(2)
        await b.put(layout.prefix + "short", b"1", lease=short)
        await asyncio.sleep(3.5)  # no refresh for longer than the TTL
        assert await b.get(layout.prefix + "short") is None
        with pytest.raises(LeaseExpired):
            await b.refresh(short)

    run_async(backend_factory, scenario)


def test_watch_sees_puts_and_deletes_in_order(backend_factory, layout, run_async):
    async def scenario(b):
        start = await b.revision()
        await b.put(layout.prefix + "w/a", b"1")
        await b.put(layout.prefix + "w/b", b"2")
        await b.delete(layout.prefix + "w/a")
        await b.put(layout.prefix + "other", b"x")
        seen = []
        async with contextlib.aclosing(
            b.watch_prefix(layout.prefix + "w/", start_revision=start + 1)
        ) as events:
            async for event in events:
                seen.append((event.kind, event.key, event.value))
                if len(seen) == 3:
                    break
        assert seen == [
            ("put", layout.prefix + "w/a", b"1"),
            ("put", layout.prefix + "w/b", b"2"),
            ("delete", layout.prefix + "w/a", b""),
        ]

    run_async(backend_factory, scenario)


def test_election_tokens_and_fenced_epoch_log(backend_factory, layout, run_async):
    async def scenario(b):
        log = EpochLog(b, layout)
        before_ms = int(time.time() * 1000)
        async with LeaseKeeper(b, 5) as first_lease, LeaseKeeper(b, 5) as second_lease:
            first = await Election(b, layout, "coord-a").campaign(first_lease)
            assert await Election(b, layout, "x").leader() == ("coord-a", first.token)
            await log.record(first, 1, EpochState.CREATED)
            await log.record(first, 1, EpochState.DURABLE, manifest="m1")
            standby = asyncio.create_task(Election(b, layout, "coord-b").campaign(second_lease))
            await asyncio.sleep(0.5)
            assert not standby.done()  # the seat is taken
            await b.revoke(first_lease.lease)  # the leader's lease ends
            second = await asyncio.wait_for(standby, 10)
            assert second.token > first.token
            with pytest.raises(
                Fenced, match=r"coord-a \(token \d+\) (is no longer the leader|lost its lease)"
            ):
                await log.record(first, 2, EpochState.CREATED)
            await log.record(second, 2, EpochState.CREATED)
            await log.record(second, 2, EpochState.ABORTED, reason="takeover")
        entries = await log.entries()
        assert [(e.epoch, e.state, e.writer) for e in entries] == [
            (1, EpochState.DURABLE, "coord-a"),
            (2, EpochState.ABORTED, "coord-b"),
        ]
        assert await log.latest_durable() == 1
        assert json.loads((await b.get(layout.latest_durable)).value)["writer"] == "coord-a"
        # when each entry was written, and when the latest durable epoch became durable
        assert all(before_ms <= e.at <= time.time() * 1000 for e in entries)
        epoch, durable_at = await log.latest_durable_at()
        assert epoch == 1 and before_ms <= durable_at <= entries[1].at

    run_async(backend_factory, scenario)


def test_a_lost_run_key_is_never_reused(backend_factory, layout, run_async):
    """etcd that lost its data: the run went back to 0 and run 1 was reused, so fencing by run
    number no longer refused a zombie of the old run 1. A run behind the caller's is written past it."""

    async def scenario(b):
        reg = Registry(b, layout)
        assert await reg.next_run(0) == 1 and await reg.next_run(1) == 2 and await reg.next_run(2) == 3
        await b.delete(layout.run)  # wiped
        assert await reg.current_run() == 0
        assert await reg.next_run(3) == 4  # not 1
        await b.put(layout.run, b"1")  # gone back
        assert await reg.next_run(4) == 5
        assert await reg.current_run() == 5
        assert await reg.next_run(4) == 5  # another watcher of the same failure: the same run

    run_async(backend_factory, scenario)


def test_a_runs_restore_request_is_written_with_the_run_and_only_with_it(backend_factory, layout, run_async):
    """The operator wrote the request and moved the run in two writes: a coordinator that read the new
    run between them chose its restore point without it (the old lineage, the old plan)."""

    async def scenario(b):
        reg = Registry(b, layout)
        assert await reg.advance_run(0, restore=b'{"lineage": "a"}') is True
        assert (await b.get(layout.restore_request(1))).value == b'{"lineage": "a"}'
        assert await reg.advance_run(0, restore=b'{"lineage": "b"}') is False  # the run had moved
        assert (await b.get(layout.restore_request(1))).value == b'{"lineage": "a"}'
        assert await b.get(layout.restore_request(2)) is None
        assert await reg.next_run(1, serving={"src/0": "pod-r1"}, restore=b'{"lineage": "c"}') == 2
        assert (await b.get(layout.restore_request(2))).value == b'{"lineage": "c"}'
        assert await reg.serving(2) == {"src/0": "pod-r1"} and await reg.serving(1) is None
        await b.delete(layout.run)  # etcd lost it: the run written past it carries its request too
        assert await reg.next_run(2, restore=b'{"lineage": "d"}') == 3
        assert (await b.get(layout.restore_request(3))).value == b'{"lineage": "d"}'

    run_async(backend_factory, scenario)


def test_run_cas_and_task_registry(backend_factory, layout, run_async):
    async def scenario(b):
        reg = Registry(b, layout)
        assert await reg.current_run() == 0
        assert await reg.advance_run(0) is True
        assert await reg.advance_run(0) is False  # a second report of the same failure
        assert await reg.advance_run(1) is True
        assert await reg.current_run() == 2
        assert await reg.next_run(2) == 3
        assert await reg.next_run(2) == 3  # another watcher of the same failure: the same run
        assert await reg.current_run() == 3
        start = await b.revision()
        lease = await b.grant(5)
        await reg.register(2, Registration("job/main/v/0", "r2-a0", "http://127.0.0.2:7700"), lease=lease)
        await reg.register(2, Registration("job/main/v/1", "r2-a1", "http://127.0.0.3:7700"), lease=lease)
        assert sorted(await reg.tasks(2)) == ["job/main/v/0", "job/main/v/1"]
        assert await reg.tasks(1) == {}
        await b.revoke(lease)
        changes: list[Change] = []
        async with contextlib.aclosing(reg.watch(2, start_revision=start + 1)) as events:
            async for change in events:
                changes.append(change)
                if len(changes) == 4:
                    break
        assert [(c.kind, c.task_id) for c in changes] == [
            ("arrived", "job/main/v/0"),
            ("arrived", "job/main/v/1"),
            ("departed", "job/main/v/0"),
            ("departed", "job/main/v/1"),
        ]
        assert changes[0].registration == Registration("job/main/v/0", "r2-a0", "http://127.0.0.2:7700")

    run_async(backend_factory, scenario)


def test_lease_keeper_keeps_a_lease_past_its_ttl(backend_factory, layout, run_async):
    async def scenario(b):
        async with LeaseKeeper(b, 2) as keeper:
            await b.put(layout.prefix + "alive", b"1", lease=keeper.lease)
            await asyncio.sleep(4)
            assert not keeper.lost.is_set()
            assert await b.get(layout.prefix + "alive") is not None
            await b.revoke(keeper.lease)
            await asyncio.wait_for(keeper.lost.wait(), 5)

    run_async(backend_factory, scenario)


def test_token_gate_refuses_a_deposed_coordinator():
    gate = TokenGate()
    assert gate.admit(10, "trigger epoch 1")
    assert gate.admit(12, "trigger epoch 2")
    assert not gate.admit(10, "commit epoch 1")
    assert gate.admit(12, "commit epoch 2")
    assert (gate.highest, gate.refused) == (12, 1)


def test_a_lease_keeper_that_fails_counts_its_lease_as_lost(caplog):
    # A refresh that raises what no store raises (a bug) cannot be produced with a real
    # store, so a LocalBackend whose refresh raises stands in for it.
    class Broken(LocalBackend):
        async def refresh(self, lease: int) -> None:
            raise RuntimeError("a bug in the refresh")

    async def scenario() -> None:
        backend = Broken()
        try:
            async with LeaseKeeper(backend, 2) as keeper:
                await asyncio.wait_for(keeper.lost.wait(), 3)
        finally:
            await backend.close()

    asyncio.run(scenario())
    assert "its keeper failed; the lease counts as lost" in caplog.text
    assert "RuntimeError: a bug in the refresh" in caplog.text
