"""PostgreSQL change data capture: changes/s of a postgres-cdc job against a plain replication loop,
and the latency from a committed database transaction to its committed output.

A PostgreSQL server of its own (`e2e/servers.py`, wal_level=logical) and a table whose slot is made
before N rows are inserted in transactions of 1,000 (100,000 by default). Each contestant reads the
N changes from its own copy of that slot (`pg_copy_logical_replication_slot`, the same position):
  plain loop   psycopg2's replication cursor, pgoutput decoded by nopstream's decoder, each change
               written as a JSON line, the slot told at the end
  nopstream    `nopstream run` of a bounded postgres-cdc source -> file sink job,
               STRICT_EXACTLY_ONCE, checkpoints every second
Then latency: the job runs unbounded while one row is inserted every 100 ms; each row carries
its commit time, and the output directory is polled every 10 ms for its committed line. The
figures are the median and 90th percentile of (seen committed - transaction committed).
Run: `python bench/cdc.py [--rows N] [--latency-rows M]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psycopg
import psycopg2
import psycopg2.extras
import yaml

from e2e import servers
from nopstream.connectors import files
from nopstream.connectors.pgoutput import Change, Commit, Relation, decode, row

ROOT = Path(__file__).resolve().parent.parent


def job(server: servers.Postgres, slot: str, out: Path, *, bounded: bool) -> dict:
    source = {"port": server.port, "user": server.user, "database": "bench", "slot": slot}
    source |= {"publication": "bench", "bounded": bounded}
    return {
        "jobId": f"cdc-{slot}",
        "checkpoint": {"intervalMs": 1000, "storage": {"local": {"path": str(out.parent / "cp")}}},
        "model": {
            "sources": [{"id": "changes", "type": "postgres-cdc", "config": source}],
            "sinks": [{"id": "out", "type": "file", "inputs": ["changes"], "config": {"path": str(out)}}],
        },
    }


def run_env(server: servers.Postgres) -> dict[str, str]:
    return {**os.environ, **server.env, "PYTHONPATH": str(ROOT)}


def nopstream_run(server: servers.Postgres, work: Path, slot: str, rows: int) -> float:
    """Seconds for the bounded job to commit every change."""
    (work / slot).mkdir()
    out = work / slot / "out"
    path = work / slot / "job.yaml"
    path.write_text(yaml.safe_dump(job(server, slot, out, bounded=True)))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "nopstream", "run", str(path), "--quiet"],
        env=run_env(server),
        cwd=work / slot,
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"nopstream run failed: {done.stderr}")
    got = files.committed_records({"path": str(out)})
    assert len(got) == rows and len({r["after"]["id"] for r in got}) == rows, len(got)
    return took


def plain_loop(server: servers.Postgres, work: Path, slot: str, rows: int) -> float:
    """Seconds for a psycopg2 replication loop to read, decode and write every change."""
    conninfo = {"host": "127.0.0.1", "port": server.port, "dbname": "bench", "user": server.user}
    start = time.perf_counter()
    conn = psycopg2.connect(
        **conninfo, password=server.password, connection_factory=psycopg2.extras.LogicalReplicationConnection
    )
    cursor = conn.cursor()
    cursor.start_replication(
        slot_name=slot, decode=False, options={"proto_version": "1", "publication_names": "bench"}
    )
    relations: dict[int, Relation] = {}
    seen, end = 0, 0
    with open(work / f"{slot}.jsonl", "wb") as out:
        while seen < rows:
            message = cursor.read_message()
            if message is None:
                time.sleep(0.001)
                continue
            decoded = decode(message.payload)
            if isinstance(decoded, Relation):
                relations[decoded.oid] = decoded
            elif isinstance(decoded, Change) and decoded.after is not None:
                change = {"op": decoded.op, "after": row(relations[decoded.relation], decoded.after)}
                out.write(orjson.dumps(change) + b"\n")
                seen += 1
            elif isinstance(decoded, Commit):
                end = decoded.end_lsn
    cursor.send_feedback(flush_lsn=end, force=True)
    conn.close()
    return time.perf_counter() - start


def latency(server: servers.Postgres, work: Path, count: int) -> list[float]:
    """Seconds from each row's commit to its line committed by a running job."""
    (work / "live").mkdir()
    out = work / "live" / "out"
    path = work / "live" / "job.yaml"
    path.write_text(yaml.safe_dump(job(server, "live", out, bounded=False)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", str(path), "--quiet"],
        env=run_env(server),
        cwd=work / "live",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    conninfo = server.conninfo.replace("dbname=postgres", "dbname=bench")
    gaps: list[float] = []
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            slot = "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'live'"
            while conn.execute(slot).fetchone() is None:
                time.sleep(0.05)
            committed: dict[int, float] = {}
            for i in range(count):
                conn.execute("INSERT INTO items VALUES (%s, 'live')", (10_000_000 + i,))
                committed[10_000_000 + i] = time.time()
                time.sleep(0.1)
                gaps += _seen(out, committed)
            deadline = time.monotonic() + 30
            while committed and time.monotonic() < deadline:
                time.sleep(0.01)
                gaps += _seen(out, committed)
        subprocess.run(
            [sys.executable, "-m", "nopstream", "savepoint", str(path), "--stop"],
            env=run_env(server),
            cwd=work / "live",
            capture_output=True,
        )
        proc.wait(timeout=60)
    finally:
        proc.kill()
    return gaps


def _seen(out: Path, committed: dict[int, float]) -> list[float]:
    """The gaps of the rows now committed in `out` (each taken once)."""
    now = time.time()
    gaps = []
    for record in files.committed_records({"path": str(out)}):
        at = committed.pop(record["after"]["id"], None)
        if at is not None:
            gaps.append(now - at)
    return gaps


def fill(server: servers.Postgres, rows: int) -> None:
    """The table, its publication, the slot every contestant copies, then `rows` inserts after it."""
    with psycopg.connect(server.conninfo.replace("dbname=postgres", "dbname=bench"), autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("CREATE PUBLICATION bench FOR TABLE items")
        conn.execute("SELECT pg_create_logical_replication_slot('origin', 'pgoutput')")
        insert = "INSERT INTO items SELECT i, 'row ' || i FROM generate_series(%s::int, %s::int) i"
        for first in range(0, rows, 1000):
            with conn.transaction():
                conn.execute(insert, (first, min(first + 1000, rows) - 1))
        for slot in ("plain", "nopstream"):
            conn.execute("SELECT pg_copy_logical_replication_slot('origin', %s)", (slot,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--latency-rows", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nopstream-bench-cdc-") as tmp:
        work = Path(tmp)
        server = servers.start_postgres(work / "pg")
        try:
            with psycopg.connect(server.conninfo, autocommit=True) as conn:
                conn.execute("CREATE DATABASE bench")
            fill(server, args.rows)
            plain = plain_loop(server, work, "plain", args.rows)
            ours = nopstream_run(server, work, "nopstream", args.rows)
            gaps = latency(server, work, args.latency_rows)
        finally:
            server.close()
    print(f"changes: {args.rows:,} in transactions of 1,000")
    print(f"  plain replication loop  {args.rows / plain:10,.0f} changes/s  ({plain:.2f} s)")
    print(f"  nopstream run           {args.rows / ours:10,.0f} changes/s  ({ours:.2f} s, start included)")
    print(f"  ratio nopstream / plain {plain / ours:.2f}")
    if gaps:
        tenth = statistics.quantiles(gaps, n=10)[-1] if len(gaps) >= 10 else max(gaps)
        print(
            f"latency, commit -> committed output (checkpoints every 1 s, {len(gaps)} rows):"
            f" median {statistics.median(gaps) * 1000:.0f} ms, p90 {tenth * 1000:.0f} ms"
        )
    print(json.dumps({"plain_s": plain, "nopstream_s": ours, "latencies_s": gaps}))


if __name__ == "__main__":
    main()
