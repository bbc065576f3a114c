"""Jobs into a real PostgreSQL: exact tables with a process killed at each named moment of the
two-phase commit, with the server restarted under a running job, and refused at start.

Each job runs a rolling word count into two tables: every update (insert) and the
latest count per word (upsert, keyed). A faulty run's tables must hold exactly
what the counts of the input say (as multisets of rows).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import psycopg
import pytest

from tests.chaos.jobs import rolling_word_count
from tests.checkpointing.test_faults import prepare, run_job, run_with_fault


def model(server, database: str, suffix: str) -> dict:
    pg = {"port": server.port, "user": server.user, "database": database, "columns": ["key", "value"]}
    return {
        "jobId": "pg-job",
        "parallelism": 2,
        "checkpoint": {"intervalMs": 150, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [{"id": "lines", "type": "file", "config": {"path": "in/*.txt"}}],
            "operators": rolling_word_count("faultfns"),
            "sinks": [
                {
                    "id": "latest",
                    "type": "postgres",
                    "inputs": ["count"],
                    "key": {"field": "key"},
                    "config": {**pg, "table": f"latest_{suffix}", "mode": "upsert", "keys": ["key"]},
                },
                {
                    "id": "every",
                    "type": "postgres",
                    "inputs": ["count"],
                    "config": {**pg, "table": f"every_{suffix}"},
                },
            ],
        },
    }


def _inputs() -> dict[str, str]:
    rng = random.Random(3)
    words = [f"w{i}" for i in range(100)]
    return {
        f"part-{f}.txt": "".join(" ".join(rng.choices(words, k=6)) + "\n" for _ in range(5000))
        for f in range(3)
    }


INPUTS = _inputs()


def connect(server, database: str) -> psycopg.Connection:
    return psycopg.connect(server.conninfo.replace("dbname=postgres", f"dbname={database}"), autocommit=True)


def tables(server, database: str, suffix: str) -> tuple[Counter, Counter]:
    with connect(server, database) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS latest_{suffix} (key text PRIMARY KEY, value bigint)")
        conn.execute(f"CREATE TABLE IF NOT EXISTS every_{suffix} (key text, value bigint)")
        latest = Counter(conn.execute(f"SELECT key, value FROM latest_{suffix}").fetchall())
        every = Counter(conn.execute(f"SELECT key, value FROM every_{suffix}").fetchall())
    return latest, every


@pytest.fixture(scope="module")
def expected() -> tuple[Counter, Counter]:
    """What a rolling count of INPUTS writes: the last count of each word, and every count 1..N once."""
    words = Counter(w for text in INPUTS.values() for w in text.split())
    assert len(words) == 100 and sum(words.values()) == 3 * 5000 * 6
    latest = Counter((w, n) for w, n in words.items())
    every = Counter((w, v) for w, n in words.items() for v in range(1, n + 1))
    return latest, every


@pytest.mark.parametrize(
    "point",
    [
        "after-stage@2",  # a sink dies after PREPARE TRANSACTION, before its barrier is acknowledged
        "before-publish@2",  # a sink dies after the manifest, before COMMIT PREPARED
        "mid-commit@1",  # a sink dies between two COMMIT PREPARED
    ],
)
def test_a_sink_killed_at_each_moment_of_the_two_phase_commit(
    point, tmp_path, postgres_server, database, expected, monkeypatch
):
    suffix = point.split("@")[0].replace("-", "_")
    tables(postgres_server, database, suffix)
    workdir = tmp_path / suffix
    prepare(workdir, model(postgres_server, database, suffix), INPUTS)
    monkeypatch.setenv("NOPSTREAM_POSTGRES_PASSWORD", postgres_server.password)
    codes, err = run_with_fault(workdir, point)
    assert codes == [0] and err.count("recovering: ") >= 1, err
    assert tables(postgres_server, database, suffix) == expected
    with connect(postgres_server, database) as conn:
        assert conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall() == []


def test_the_server_down_for_six_seconds_under_a_running_job(tmp_path, postgres_server, database, expected):
    """A 6 s PostgreSQL restart used all 10 recoveries in about 6 s and failed the job (this test
    gave it 30 before): with the restart policy's backoff the default limit outlives it. Here it
    also passed without the backoff (each recovery took longer); the test that fails without it
    is `test_runner.py::test_an_outage_of_a_few_seconds_is_outlived_by_backing_off`."""
    from e2e import servers

    own = servers.start_postgres(tmp_path / "own")
    try:
        with connect(own, "postgres") as conn:
            conn.execute("CREATE DATABASE jobs")
        tables(own, "jobs", "restart")
        workdir = tmp_path / "restart"
        prepare(workdir, model(own, "jobs", "restart"), INPUTS)

        def restart_once_rows_arrive() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with connect(own, "jobs") as conn:
                    if conn.execute("SELECT count(*) FROM every_restart").fetchone()[0] > 2000:
                        break
                time.sleep(0.05)
            own.restart(down=6.0)

        restarter = threading.Thread(target=restart_once_rows_arrive)
        restarter.start()
        result = run_job(workdir, env=own.env)
        restarter.join()
        assert result.returncode == 0, result.stderr
        assert result.stderr.count("recovering: ") >= 1, result.stderr
        assert tables(own, "jobs", "restart") == expected
    finally:
        own.close()


def test_a_job_whose_table_is_missing_is_refused_at_once(tmp_path, postgres_server, database):
    workdir = tmp_path / "missing"
    prepare(workdir, model(postgres_server, database, "missing"), INPUTS)
    with connect(postgres_server, database) as conn:
        conn.execute("CREATE TABLE every_missing (key text, value bigint)")
    started = time.monotonic()
    result = run_job(workdir, env=postgres_server.env)
    assert result.returncode == 3 and time.monotonic() - started < 30, result.stderr
    assert (
        f"postgres sink 'latest': relation \"latest_missing\" does not exist in"
        f" postgresql://127.0.0.1:{postgres_server.port}/{database} (create the table first)"
    ) in result.stderr
    assert "recovering: " not in result.stderr and "Traceback" not in result.stderr
