"""A coordinator candidate as its own process, for the failover tests (test infrastructure).

Usage: python -m tests.leases.candidate HOST PORT JOB NAME TTL

It campaigns on the job's coordinator key; once leader it prints
`LEADER <name> <token> <unix time>` and writes a new CREATED entry to the epoch log
every 100 ms. A refused (fenced) write prints `FENCED <name>` and exits 4; a lost
lease prints `LOST <name>` and exits 3.
"""

from __future__ import annotations

import asyncio
import sys
import time

from nopstream.cluster.election import Election
from nopstream.cluster.epochlog import EpochLog
from nopstream.cluster.errors import Fenced
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.leases import LeaseKeeper
from nopstream.plan.epochs import EpochState


async def main(host: str, port: int, job: str, name: str, ttl: int) -> int:
    backend = EtcdBackend(host, port)
    layout = Layout("failover", job, "main")
    log = EpochLog(backend, layout)
    try:
        async with LeaseKeeper(backend, ttl) as keeper:
            leadership = await Election(backend, layout, name).campaign(keeper)
            print(f"LEADER {name} {leadership.token} {time.time():.3f}", flush=True)
            entries = await log.entries()
            epoch = entries[-1].epoch + 1 if entries else 1
            while True:
                try:
                    await log.record(leadership, epoch, EpochState.CREATED)
                except Fenced:
                    print(f"FENCED {name}", flush=True)
                    return 4
                if keeper.lost.is_set():
                    print(f"LOST {name}", flush=True)
                    return 3
                epoch += 1
                await asyncio.sleep(0.1)
    finally:
        await backend.close()


if __name__ == "__main__":
    host, port, job, name, ttl = sys.argv[1:]
    sys.exit(asyncio.run(main(host, int(port), job, name, int(ttl))))
