"""Built-in lookups (`type: lookup`) against a real HTTP service and a real PostgreSQL: each record's
result in its field, calls bounded by the cache (counted on the service's side and in the
task's metrics), a missing row as null."""

from __future__ import annotations

import random
from typing import Any

import psycopg

from e2e.servers import free_port
from tests.lookup_server import LookupServer, lookup_server
from tests.runtime.conftest import multiset, run_job


def lookup_job(lookup: dict[str, Any], *, capacity: int = 10) -> dict[str, Any]:
    return {
        "sources": [
            {"id": "orders", "type": "file", "config": {"path": "in/orders.jsonl", "format": "jsonl"}}
        ],
        "operators": [
            {
                "id": "looked-up",
                "type": "lookup",
                "inputs": ["orders"],
                "lookup": lookup,
                "async": {"capacity": capacity},
            }
        ],
        "sinks": [{"id": "out", "type": "file", "inputs": ["looked-up"], "config": {"path": "out"}}],
    }


def orders(count: int, customers: int) -> list[dict[str, Any]]:
    rng = random.Random(9)
    return [{"order": i, "customer": rng.randrange(customers)} for i in range(count)]


def test_an_http_lookup_puts_the_body_into_the_record_and_its_cache_spares_the_service(tmp_path, mode):
    given = orders(2000, 40)
    with lookup_server(LookupServer()) as server:
        lookup = {
            "kind": "http",
            "url": server.url + "/score?id={customer}",
            "into": "score",
            "cache": {"maxEntries": 100, "ttlMs": 60_000},
        }
        out = run_job(
            tmp_path, lookup_job(lookup, capacity=1), mode=mode, inputs={"orders.jsonl": given}, parallelism=1
        )
    want = [{**o, "score": {"id": o["customer"], "score": o["customer"] * 7 % 100}} for o in given]
    assert multiset(out["out"]) == multiset(want)
    # one subtask, one call at a time: every customer asked for once, the rest from the cache
    assert server.requests == {c: 1 for c in range(40)}


def test_an_http_lookup_without_a_cache_asks_for_every_record(tmp_path):
    given = orders(300, 10)
    with lookup_server(LookupServer()) as server:
        lookup = {"kind": "http", "url": server.url + "/score?id={customer}", "into": "score"}
        out = run_job(
            tmp_path, lookup_job(lookup), mode="processes", inputs={"orders.jsonl": given}, parallelism=2
        )
    assert len(out["out"]) == 300 and sum(server.requests.values()) == 300


def test_a_postgres_lookup_puts_the_first_row_into_the_record_or_null(
    tmp_path, postgres_server, database, mode
):
    with psycopg.connect(
        postgres_server.conninfo.replace("dbname=postgres", f"dbname={database}"), autocommit=True
    ) as conn:
        conn.execute("CREATE TABLE customers (id integer PRIMARY KEY, tier text, since integer)")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO customers VALUES (%s, %s, %s)",
                [(c, ["bronze", "silver", "gold"][c % 3], 2000 + c) for c in range(25)],  # 25..29: none
            )
    lookup = {
        "kind": "postgres",
        "port": postgres_server.port,
        "user": postgres_server.user,
        "database": database,
        "query": "SELECT tier, since FROM customers WHERE id = %(customer)s",
        "into": "customer-row",
        "cache": {"maxEntries": 5, "ttlMs": 60_000},
    }
    given = orders(1500, 30)
    out = run_job(
        tmp_path, lookup_job(lookup, capacity=4), mode=mode, inputs={"orders.jsonl": given}, parallelism=2
    )

    def row(c: int) -> dict[str, Any] | None:
        return {"tier": ["bronze", "silver", "gold"][c % 3], "since": 2000 + c} if c < 25 else None

    assert multiset(out["out"]) == multiset([{**o, "customer-row": row(o["customer"])} for o in given])


def test_a_lookups_figures_reach_the_tasks_metrics():
    """Hits, calls, in flight and the calls' mean duration, as `TaskStats` carries them to the dashboard."""
    import asyncio

    from nopstream.plan.streamgraph import StreamNode
    from nopstream.records import Batch
    from nopstream.runtime.chain import Chain
    from nopstream.runtime.keyed import ShardCache
    from nopstream.runtime.metrics import TaskStats

    class Slow:
        def key(self, record: Any) -> Any:
            return record["customer"]

        async def fetch(self, key: Any) -> Any:
            await asyncio.sleep(0.01)
            return {"c": key}

        async def close(self) -> None:
            """Nothing to release."""

    class Connectors:
        def lookup(self, node: StreamNode, *, capacity: int) -> Slow:
            return Slow()

    lookup = {"kind": "http", "url": "x", "into": "r", "cache": {}}
    spec = {"id": "l", "type": "lookup", "lookup": lookup, "async": {"capacity": 1}}  # one call at a time
    node = StreamNode("l", "operator", "lookup", 1, False, None, spec)
    emitted: list[Any] = []

    async def emit(op_id: str, output: str, batch: Batch) -> None:
        emitted.extend(batch.records)

    chain = Chain(
        [node], subtask=0, parallelism=1, shards=None, cache=ShardCache(16),
        connectors=Connectors(), clock=lambda: 0, emit=emit, origin="src",  # type: ignore[arg-type]
    )  # fmt: skip
    asyncio.run(chain.push(0, Batch([{"customer": c % 3} for c in range(9)]), 0))
    figures = chain.lookups()
    assert (figures["hits"], figures["misses"], figures["in_flight"]) == (6, 3, 0)
    assert 10 <= figures["latency_ms"] < 200
    assert TaskStats.from_json(TaskStats(lookups=figures).to_json()).lookups == figures
    assert [r["r"] for r in emitted] == [{"c": c % 3} for c in range(9)]


def test_a_postgres_lookup_that_runs_past_its_time_out_falls_back(tmp_path, postgres_server, database):
    with psycopg.connect(
        postgres_server.conninfo.replace("dbname=postgres", f"dbname={database}"), autocommit=True
    ) as conn:
        conn.execute("CREATE TABLE customers (id integer PRIMARY KEY, tier text)")
        conn.execute("INSERT INTO customers SELECT i, 'tier-' || i FROM generate_series(0, 9) i")
    lookup = {
        "kind": "postgres",
        "port": postgres_server.port,
        "user": postgres_server.user,
        "database": database,
        # customer 3's query sleeps 3 s: past the time-out, every time
        "query": "SELECT tier FROM customers,"
        " LATERAL (SELECT pg_sleep(CASE WHEN %(customer)s = 3 THEN 3 ELSE 0 END)) AS s"
        " WHERE id = %(customer)s",
        "into": "row",
    }
    model = lookup_job(lookup, capacity=2)
    model["operators"][0]["async"] |= {"timeoutMs": 1000, "onTimeout": "jobfns:unknown"}
    fns = "def unknown(record):\n    return {**record, 'row': 'unknown'}\n"
    given = [{"order": i, "customer": i % 10} for i in range(40)]
    out = run_job(tmp_path, model, mode="processes", fns=fns, inputs={"orders.jsonl": given}, parallelism=1)
    want = [
        {**o, "row": "unknown" if o["customer"] == 3 else {"tier": f"tier-{o['customer']}"}} for o in given
    ]
    assert out["out"] == want  # in order, the slow ones by the fallback, the pool still serving the rest


def test_a_postgres_lookup_closes_its_pool_and_its_connections_when_its_task_ends(postgres_server, database):
    """`Task.run` closes its chain's lookups as it ends. A pool left open to the end of the task's loop
    kept its process from exiting: a CI run's job hung past 120 s after its last record, a pool
    worker still waiting for work once its connection attempt took the loop's cancellation as a
    failure. A lookup whose pool never opened closes without raising again."""
    import asyncio
    import time

    from nopstream.connectors.postgres import PostgresLookup

    server = {"port": postgres_server.port, "user": postgres_server.user, "database": database}
    lookup = PostgresLookup({**server, "query": "SELECT %(customer)s::int * 2 AS twice"}, capacity=3)

    async def look_up_then_close() -> Any:
        rows = await asyncio.gather(*(lookup.fetch((c,)) for c in range(6)))
        assert rows == [{"twice": c * 2} for c in range(6)]
        await lookup.close()
        return lookup._pool.result()  # type: ignore[union-attr]

    assert asyncio.run(look_up_then_close()).closed

    def connected() -> int:
        with psycopg.connect(postgres_server.conninfo, autocommit=True) as conn:
            found = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,))
            return found.fetchone()[0]

    deadline = time.monotonic() + 10  # a backend ends a moment after its client closed
    while connected() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert connected() == 0

    nowhere = PostgresLookup({**server, "port": free_port(), "query": "SELECT 1"}, capacity=1)

    async def fail_then_close() -> None:
        try:
            await nowhere.fetch(())
        except psycopg.OperationalError:
            pass
        else:
            raise AssertionError("a lookup with no server answered")
        await nowhere.close()

    asyncio.run(fail_then_close())
