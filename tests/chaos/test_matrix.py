"""`nopstream chaos` over a matrix of job shapes x modes, each cell exactly once under SIGKILLs.

Every cell runs the real command: the job failure-free, then again while tasks,
coordinator candidates (`--etcd`) and the whole runner are SIGKILLed at seeded random
moments from the first second on, and the runner started again after each
whole-runner kill. Six kills are asked of each of the twelve cells and at least five
must land, so a CI run makes at least 60. The last test shows that the check can
fail: a job whose function is not deterministic is reported, exit 1.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos import jobs
from tests.conftest import run_nopstream

KILLS = 6
MODES = ["run", "etcd"]


def chaos(job, tmp_path, *, mode: str, etcd_server, seed: int, env: dict[str, str] | None = None):
    args = [
        "chaos",
        str(job),
        "--kills",
        str(KILLS),
        "--seed",
        str(seed),
        "--workdir",
        str(tmp_path / "chaos"),
        "--timeout",  # each run: chaos kills what it started when one takes longer
        "150",
    ]
    if mode == "etcd":
        host, port = etcd_server.endpoint
        args += ["--etcd", f"{host}:{port}"]
    return run_nopstream(*args, env=env, cwd=tmp_path, timeout=400)


def check(result, capsys, cell: str) -> None:
    with capsys.disabled():
        print(f"\n[chaos] {cell}\n{result.out}{result.err}", end="")
    assert result.code == 0, result.out + result.err
    kills = int(re.search(r"SIGKILLs: (\d+)", result.out).group(1))
    assert kills >= KILLS - 1, f"only {kills} SIGKILLs landed"
    assert re.search(r"restores: \d+ task starts, \d+ from a durable epoch", result.out), result.out
    assert "missing: 0\n" in result.out and "duplicated: 0\n" in result.out
    assert "verdict: exactly once" in result.out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", sorted(jobs.SHAPES))
def test_chaos_cell(shape, mode, tmp_path, etcd_server, capsys):
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.SHAPES[shape](home))
    seed = sorted(jobs.SHAPES).index(shape) * 2 + MODES.index(mode)
    check(chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=seed), capsys, f"{shape} / {mode}")


@pytest.mark.parametrize("mode", MODES)
def test_chaos_cell_minio_to_minio(mode, tmp_path, etcd_server, minio_server, minio_client, bucket, capsys):
    home = tmp_path / "job"
    model = jobs.minio_to_minio(home, client=minio_client, bucket=bucket, endpoint=minio_server.url)
    job = jobs.prepare(home, model)
    env = {
        "NOPSTREAM_S3_ACCESS_KEY": minio_server.access_key,
        "NOPSTREAM_S3_SECRET_KEY": minio_server.secret_key,
    }
    result = chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=20 + MODES.index(mode), env=env)
    check(result, capsys, f"minio-to-minio / {mode}")
    staged = [o.object_name for o in minio_client.list_objects(bucket, prefix="out/", recursive=True)]
    assert staged and not [k for k in staged if "/.staging/" in k]


def test_chaos_cell_final_counts_over_the_stripes_of_one_object(
    tmp_path, etcd_server, minio_server, minio_client, bucket, capsys
):
    home = tmp_path / "job"
    model = jobs.minio_final_count(home, client=minio_client, bucket=bucket, endpoint=minio_server.url)
    env = {
        "NOPSTREAM_S3_ACCESS_KEY": minio_server.access_key,
        "NOPSTREAM_S3_SECRET_KEY": minio_server.secret_key,
    }
    result = chaos(jobs.prepare(home, model), tmp_path, mode="run", etcd_server=etcd_server, seed=24, env=env)
    check(result, capsys, "minio-final-count / run")
    assert "committed records: 200 failure-free, 200 under kills" in result.out  # one per word
    # and each count is the object's: every line read once by one subtask, with and without kills
    expected = Counter(minio_client.get_object(bucket, "in/big.txt").read().decode().split())
    runs: dict[str, Counter[str]] = {}
    for o in minio_client.list_objects(bucket, prefix="out/", recursive=True):
        assert "/.staging/" not in o.object_name, o.object_name
        for line in minio_client.get_object(bucket, o.object_name).read().splitlines():
            record = json.loads(line)
            runs.setdefault(o.object_name.split("/")[1], Counter())[record["key"]] += record["value"]
    assert len(runs) == 2 and all(counts == expected for counts in runs.values())


@pytest.mark.parametrize("mode", ["run"])  # the etcd mode is walked by the Kafka cells
def test_chaos_cell_files_to_postgres(mode, tmp_path, etcd_server, postgres_server, database, capsys):
    import psycopg

    conninfo = postgres_server.conninfo.replace("dbname=postgres", f"dbname={database}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for statement in jobs.POSTGRES_TABLES:
            conn.execute(statement)
    home = tmp_path / "job"
    model = jobs.files_to_postgres(
        home, port=postgres_server.port, user=postgres_server.user, database=database
    )
    job = jobs.prepare(home, model)
    result = chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=30 + MODES.index(mode))
    check(result, capsys, f"files-to-postgres / {mode}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        tables = {t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert tables == {
            "counts",
            "updates",
            "nopstream_commits",
            "nopstream_staged_rows",
        }  # the runs' dropped
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM nopstream_staged_rows").fetchone() == (0,)


@pytest.mark.parametrize(
    ("shape", "mode"), [("kafka-to-kafka", "run"), ("kafka-to-kafka", "etcd"), ("files-to-kafka", "etcd")]
)
def test_chaos_cell_kafka(shape, mode, tmp_path, etcd_server, kafka, capsys):
    home = tmp_path / "job"
    build = jobs.kafka_to_kafka if shape == "kafka-to-kafka" else jobs.files_to_kafka
    job = jobs.prepare(home, build(home, kafka=kafka))
    seed = 40 + 2 * (shape == "files-to-kafka") + MODES.index(mode)
    check(chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=seed), capsys, f"{shape} / {mode}")


@pytest.mark.parametrize("mode", ["run"])
def test_chaos_cell_kafka_to_postgres(mode, tmp_path, etcd_server, kafka, postgres_server, database, capsys):
    import psycopg

    conninfo = postgres_server.conninfo.replace("dbname=postgres", f"dbname={database}")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(jobs.POSTGRES_TABLES[0])
    home = tmp_path / "job"
    model = jobs.kafka_to_postgres(
        home, kafka=kafka, port=postgres_server.port, user=postgres_server.user, database=database
    )
    result = chaos(
        jobs.prepare(home, model), tmp_path, mode=mode, etcd_server=etcd_server, seed=50 + MODES.index(mode)
    )
    check(result, capsys, f"kafka-to-postgres / {mode}")


@pytest.mark.parametrize("mode", ["run"])  # the combiner is the same code under --etcd
def test_chaos_cell_final_counts_pre_aggregated(mode, tmp_path, etcd_server, capsys):
    """Random kills rarely land while partials are held at a durable epoch; the fault point that
    always does is `tests/runtime/test_combiner.py` (it fails when partials miss the barrier)."""
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.final_count(home))
    result = chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=60 + MODES.index(mode))
    check(result, capsys, f"final-count / {mode}")
    assert "committed records: 200 failure-free, 200 under kills" in result.out  # one per word


@pytest.mark.parametrize("mode", ["run"])  # the combiner is the same code under --etcd
def test_chaos_cell_window_averages_pre_aggregated(mode, tmp_path, etcd_server, capsys):
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.combined_windows(home))
    result = chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=70 + MODES.index(mode))
    check(result, capsys, f"combined-windows / {mode}")
    windows = {
        (e["k"], start)
        for events in jobs.windowed_events(4, 2, 2000).values()
        for e in events
        for start in range((e["ts"] // 250 - 3) * 250, e["ts"] + 1, 250)
    }
    assert f"committed records: {len(windows)} failure-free, {len(windows)} under kills" in result.out


def test_chaos_reports_a_function_that_is_not_deterministic(tmp_path, etcd_server):
    job = jobs.file_to_file_mapping_with(tmp_path / "job", "stamp", "return f'{line} {time.time_ns()}'")
    result = chaos(job, tmp_path, mode="run", etcd_server=etcd_server, seed=0)
    assert result.code == 1, result.out + result.err
    assert "committed records: 8000 failure-free, " in result.out
    assert re.search(r"missing: [1-9]\d*\n    w\d+ ", result.out), result.out
    assert "verdict: NOT exactly once" in result.out


def test_a_run_that_does_not_end_is_reported_with_where_each_process_waits(tmp_path, etcd_server):
    """A user function that never returns: chaos gives up at its timeout, names the frame each
    process waits in (the tasks in the function, the leader's run on them), and leaves nothing behind."""
    job = jobs.file_to_file_mapping_with(tmp_path / "job", "stall", "time.sleep(3600)")
    host, port = etcd_server.endpoint
    args = ["chaos", str(job), "--workdir", str(tmp_path / "chaos"), "--timeout", "12"]
    result = run_nopstream(*args, "--etcd", f"{host}:{port}", cwd=tmp_path, timeout=120)
    assert result.code == 3, result.out + result.err
    first, *waits = result.err.splitlines()
    assert re.fullmatch(
        r"chaos: chaos-\w+-clean: the job did not finish within 12s; where its processes wait:", first
    ), result.err
    assert re.match(r"runner\.err \(pid \d+\)", waits[0]) and "supervisor.py" in waits[1], result.err
    assert re.search(r"  thread MainThread: chaosfns\.py:\d+ stall <- ", result.err), result.err
    # the leader waits on them: for their status, to take its first barrier, or for its ACKs
    waits_on_tasks = r"  task run \d+: .*(coordinator_api\.py:\d+ (status|barrier)|epochs\.py:\d+ _take)"
    assert re.search(waits_on_tasks, result.err), result.err
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", result.err)]
    assert len(pids) >= 4 and not [p for p in pids if Path(f"/proc/{p}").exists()]
