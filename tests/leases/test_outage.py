"""etcd down for longer than a lease TTL, then back: holders lose their leases, nothing is written."""

from __future__ import annotations

import asyncio

import pytest

from e2e import servers
from nopstream.cluster.backend import StoreUnavailable
from nopstream.cluster.election import Election
from nopstream.cluster.epochlog import EpochLog
from nopstream.cluster.errors import Fenced
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.leases import LeaseKeeper
from nopstream.plan.epochs import EpochState


def test_outage_loses_leases_refuses_writes_and_recovers(tmp_path):
    etcd = servers.start_etcd(tmp_path)
    host, port = etcd.endpoint
    layout = Layout("outage", "job", "main")

    async def scenario():
        nonlocal etcd
        backend = EtcdBackend(host, port, timeout=1.0)
        log = EpochLog(backend, layout)
        keeper = LeaseKeeper(backend, 2)
        await keeper.__aenter__()
        leadership = await Election(backend, layout, "coord-a").campaign(keeper)
        await log.record(leadership, 1, EpochState.DURABLE)
        etcd.stop()  # the whole store goes away for longer than the TTL
        with pytest.raises(StoreUnavailable):
            await log.record(leadership, 2, EpochState.CREATED)
        await asyncio.wait_for(keeper.lost.wait(), 6)
        await keeper.close()
        etcd = servers.start_etcd(tmp_path, data_dir=etcd.data_dir, client_port=port)
        # the store is back; the old holder lost its lease and writes nothing more ...
        with pytest.raises(Fenced, match="lost its lease"):
            await log.record(leadership, 2, EpochState.CREATED)
        # ... and once etcd lets the old lease expire, a new holder leads with a higher token
        fresh = LeaseKeeper(backend, 2)
        for _ in range(100):  # the client reconnects within its (short) backoff
            try:
                await fresh.__aenter__()
                break
            except StoreUnavailable:
                await asyncio.sleep(0.1)
        try:
            again = await asyncio.wait_for(Election(backend, layout, "coord-a").campaign(fresh), 30)
            assert again.token > leadership.token
            await log.record(again, 2, EpochState.CREATED)
        finally:
            await fresh.close()
        assert await log.latest_durable() == 1
        assert [(e.epoch, e.state) for e in await log.entries()] == [
            (1, EpochState.DURABLE),
            (2, EpochState.CREATED),
        ]
        await backend.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
    finally:
        etcd.stop()
