"""`nopstream chaos` over a matrix of job shapes x modes, each cell exactly once under its schedule.

Every cell runs the real command: the job failure-free, then again under a seeded
schedule (`nopstream/local/kills.py`): SIGKILLs of tasks, coordinator candidates
(`--etcd`) and the whole runner (started again after it), a share at once and the
others after a new durable epoch, and one armed fault point for each protocol step
the job has. Every cell must report each kill landed, every fault point hit, task
starts that restored state from a durable epoch, and nothing missing or doubled:
`nopstream chaos` exits 1 on a shallow run. The jobs read their sources in batches of
at most 100 records held 10 ms (`NOPSTREAM_BATCH_SIZE`, `NOPSTREAM_BATCH_TARGET_MS`),
so their paced functions do not hold their barriers back (`tests/chaos/jobs.py`).
`test_mutants.py` shows that the cells catch real exactly-once bugs; the test of a
function that is not deterministic here shows a difference is reported, exit 1.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from nopstream import faults
from tests.chaos import jobs, live_cdc
from tests.conftest import KAFKA_USERS, run_nopstream
from tests.lookup_server import LookupServer, lookup_server

KILLS = 4
MODES = ["run", "etcd"]
PACED = {"NOPSTREAM_BATCH_SIZE": "100", "NOPSTREAM_BATCH_TARGET_MS": "10"}
ETCD_KILLS = 2
"""With --etcd a dead coordinator leads again only once its lease ran out (`supervisor.LEASE_TTL`,
4 s), and a recovery starts new task processes (not forks), so the etcd cell has fewer random
kills (its fault points are all armed; chaos holds the input at its end until the schedule is
done). The coordination is the same code for every shape, so one shape runs there: Kafka to Kafka
(a rolling count, keyed state restored, into a transactional sink fenced across coordinators). The
broadcast rules (3.5 minutes of CI there) and the joins (5 to 8) restore their state by the same
code in their `run` cells."""
RUNNER_KILLS = {"before-manifest", "after-durable", "during-savepoint"}
"""The points where the coordinator kills a task, passed only where a runner gave it that action: with
--etcd the same steps are the coordinator's own death (`coordinator-*`)."""
BIG_INPUT = {"CHAOS_PACE": "0.0005"}
"""The pace of the jobs whose objects must be large (36,000 rows: several stripes or row groups
each): at the others' 2 ms a record their failure-free run alone took 70 s. Chaos holds the input
at its end until its schedule is done, so only the sink steps need it to last."""
FINAL_OUTPUT = "--allow-shallow"
"""A job that emits only at its end (final counts) stages, publishes and commits once, in its
final epoch: after a sink's fault point there, the job is over, and the other sink points and the
kills left cannot land. Its cells allow that and check what must have been reached instead."""


def chaos(job, tmp_path, *, mode: str, etcd_server, seed: int, env: dict[str, str] | None = None, extra=()):
    args = [
        "chaos",
        str(job),
        *extra,
        "--kills",
        str(ETCD_KILLS if mode == "etcd" else KILLS),
        "--seed",
        str(seed),
        "--workdir",
        str(tmp_path / "chaos"),
        # each run: chaos kills what it started when one takes longer (a loaded CI machine ran the
        # cells 3 to 10 times slower than a quiet one)
        "--timeout",
        "500" if mode == "etcd" else "300",
    ]
    if mode == "etcd":  # a busy machine slows its coordinators' failovers most
        host, port = etcd_server.endpoint
        args += ["--etcd", f"{host}:{port}"]
    return run_nopstream(*args, env={**PACED, **(env or {})}, cwd=tmp_path, timeout=1200)


def check(
    result, capsys, cell: str, *, final_output: bool = False, not_its_steps: set[str] = frozenset()
) -> None:
    with capsys.disabled():
        print(f"\n[chaos] {cell}\n{result.out}{result.err}", end="")
    assert result.code == 0, result.out + result.err
    restored = int(re.search(r"restores: \d+ task starts, (\d+) from a durable epoch", result.out).group(1))
    assert restored >= 1, result.out
    assert "missing: 0\n" in result.out and "duplicated: 0\n" in result.out
    assert "verdict: exactly once" in result.out
    hit, armed = map(int, re.search(r"fault points hit: (\d+) of (\d+)", result.out).groups())
    if final_output:  # the sinks' steps come once, at the end (FINAL_OUTPUT)
        assert hit >= 3 and "no kill reached a durable epoch" not in result.out, result.out
        return
    kills = int(re.search(r"SIGKILLs: (\d+)", result.out).group(1))
    assert kills >= (ETCD_KILLS if "etcd" in cell else KILLS), f"only {kills} SIGKILLs landed"
    # every step: the coordinator's, the sinks', alignment's and restore's
    steps = faults.POINTS.keys() - (RUNNER_KILLS if "etcd" in cell else set()) - not_its_steps
    assert hit == armed == len(steps), result.out
    assert "shallow" not in result.out


@pytest.mark.parametrize(("shape", "mode"), [(shape, "run") for shape in sorted(jobs.SHAPES)])
def test_chaos_cell(shape, mode, tmp_path, etcd_server, capsys):
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.SHAPES[shape](home))
    seed = sorted(jobs.SHAPES).index(shape) * 2 + MODES.index(mode)
    extra = jobs.CHAOS_ARGS.get(shape, ())
    result = chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=seed, extra=extra)
    check(result, capsys, f"{shape} / {mode}", not_its_steps=jobs.NOT_ITS_STEPS.get(shape, set()))


@pytest.mark.parametrize("mode", ["run"])
def test_chaos_cell_minio_to_minio(mode, tmp_path, etcd_server, minio_server, minio_client, bucket, capsys):
    home = tmp_path / "job"
    model = jobs.minio_to_minio(home, client=minio_client, bucket=bucket, endpoint=minio_server.url)
    job = jobs.prepare(home, model)
    env = {
        "NOPSTREAM_S3_ACCESS_KEY": minio_server.access_key,
        "NOPSTREAM_S3_SECRET_KEY": minio_server.secret_key,
    }
    # paced: since task processes start in milliseconds (no ldconfig at each start), the unpaced job
    # ended before the last kills of its schedule
    result = chaos(
        job,
        tmp_path,
        mode=mode,
        etcd_server=etcd_server,
        seed=20 + MODES.index(mode),
        env=env,
        extra=("--pace", "10"),
    )
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
    job = jobs.prepare(home, model)
    result = chaos(job, tmp_path, mode="run", etcd_server=etcd_server, seed=24, env=env, extra=[FINAL_OUTPUT])
    check(result, capsys, "minio-final-count / run", final_output=True)
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


@pytest.mark.parametrize("mode", ["run"])
def test_chaos_cell_files_to_postgres(mode, tmp_path, etcd_server, postgres_server, database, capsys):
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


def test_chaos_cell_async_lookup(tmp_path, etcd_server, capsys):
    """Kills while requests to a real HTTP service are in flight (its data fixed): exact, and every
    record looked up at least once (a recovery asks again for what its epoch had not seen)."""
    server = LookupServer(latency=lambda n: 0.02)
    with lookup_server(server):
        home = tmp_path / "job"
        job = jobs.prepare(home, jobs.async_lookup(home, url=server.url))
        result = chaos(job, tmp_path, mode="run", etcd_server=etcd_server, seed=50, extra=("--pace", "200"))
    check(result, capsys, "async-lookup / run")
    assert set(server.requests) == set(range(3000)) and server.most_in_flight <= 2 * 20
    # both runs asked for every record, and the recoveries asked again for what was not durable
    assert sum(server.requests.values()) > 2 * 3000


@pytest.mark.parametrize("mode", MODES)
def test_chaos_cell_kafka(mode, tmp_path, etcd_server, kafka, capsys):
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.kafka_to_kafka(home, kafka=kafka))
    seed = 40 + MODES.index(mode)
    check(
        chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=seed),
        capsys,
        f"kafka-to-kafka / {mode}",
    )


def sasl_ssl(auth, mechanism: str) -> dict:
    """A connection as the user `app` over the broker's SASL_SSL listener, the broker verified."""
    return {
        "bootstrapServers": auth.sasl_bootstrap,
        "securityProtocol": "SASL_SSL",
        "sasl": {"mechanism": mechanism, "username": "app"},
        "tls": {"caFile": str(auth.ca)},
    }


def test_chaos_cell_csv_files(tmp_path, etcd_server, capsys):
    """CSV orders read in stripes (the header only in each file's first) into rolling counts written
    as CSV files, a header in each committed file."""
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.csv_to_csv(home))
    result = chaos(job, tmp_path, mode="run", etcd_server=etcd_server, seed=52, env=BIG_INPUT)
    check(result, capsys, "csv-files / run")


def test_chaos_cell_parquet_files(tmp_path, etcd_server, capsys):
    """Parquet orders read by row groups into rolling counts written as Parquet files (several row
    groups each, the footer written when the epoch's transaction is staged)."""
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.parquet_to_parquet(home))
    result = chaos(job, tmp_path, mode="run", etcd_server=etcd_server, seed=53, env=BIG_INPUT)
    check(result, capsys, "parquet-files / run")


def test_chaos_cell_kafka_sasl_ssl_avro_both_ways(
    tmp_path, etcd_server, kafka_server, kafka, registry, capsys
):
    """Avro orders over SASL_SSL, written with two schemas (the second registered mid-stream), into
    running totals the sink registers and writes in Avro over SASL_SSL: every restarted task reads
    each value by its schema id and writes with the schema it registered."""
    connection = sasl_ssl(kafka_server.auth, "SCRAM-SHA-256")
    home = tmp_path / "job"
    job = jobs.prepare(
        home, jobs.kafka_avro_totals(home, kafka=kafka, registry=registry, connection=connection)
    )
    env = {"NOPSTREAM_KAFKA_PASSWORD": KAFKA_USERS["app"]}
    result = chaos(job, tmp_path, mode="run", etcd_server=etcd_server, seed=48, env=env)
    check(result, capsys, "kafka-avro / run")
    assert KAFKA_USERS["app"] not in result.out + result.err


@pytest.mark.parametrize("mode", ["run"])
def test_chaos_cell_kafka_to_postgres(mode, tmp_path, etcd_server, kafka, postgres_server, database, capsys):
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


def cdc_chaos(job, tmp_path, etcd_server, capsys, server, conninfo: str, *, seed: int, cell: str, committed):
    """`nopstream chaos` of a postgres-cdc job beside `live_cdc.LiveChanges` of its server: exact, with
    `committed(changes made)` records in each run, the server restarted under the run under kills and
    recovered from, and only the job's slot left."""
    changes = live_cdc.LiveChanges(server, conninfo, seed=seed)
    changes.start()
    result = chaos(job, tmp_path, mode="run", etcd_server=etcd_server, seed=seed, env=server.env)
    check(result, capsys, f"{cell} / run")  # first: a chaos that failed says why
    changes.join(60)
    count = committed(changes.changes)
    assert f"committed records: {count} failure-free, {count} under kills" in result.out
    assert changes.restarted, "the server was not restarted while the run under kills read it"
    assert live_cdc.recovered_from_the_restart(tmp_path / "chaos")
    live_cdc.only_the_slot_left(conninfo)


def test_chaos_cell_postgres_cdc_to_kafka(tmp_path, etcd_server, kafka, capsys, monkeypatch):
    """An initial snapshot of 1,500 rows, then the changes made while the failure-free run reads; the run
    under kills reads them too (its own copy of the job's slot), kills landing in the snapshot and in the
    changes, and the server restarted under it."""
    from e2e import servers

    server = servers.start_postgres(tmp_path / "pg")
    monkeypatch.setenv("NOPSTREAM_POSTGRES_PASSWORD", server.password)  # the snapshot's copy, made here
    try:
        with psycopg.connect(server.conninfo, autocommit=True) as conn:
            conn.execute("CREATE DATABASE shop")
        conninfo, source = live_cdc.cdc_source(server, "shop", snapshot_rows=1500)
        topic = kafka.create("row-changes", partitions=2)
        per_row = {
            "type": "kafka",
            "config": {"bootstrapServers": kafka.bootstrap, "topic": topic, "keyField": "key"},
        }
        job = jobs.prepare(tmp_path / "job", jobs.postgres_cdc(source, per_row, bounded=False))
        # every change once in the file, and one rolling count per change in the topic
        cdc_chaos(
            job,
            tmp_path,
            etcd_server,
            capsys,
            server,
            conninfo,
            seed=61,
            cell="postgres-cdc-to-kafka",
            committed=lambda changes: 2 * (changes + 1500),
        )
    finally:
        server.close()


def test_chaos_cell_postgres_cdc_to_postgres_over_tls(tmp_path, etcd_server, capsys):
    """A server that takes only TLS with client certificates (replication too): the source reads its
    slot and the sink upserts each row's count over verified TLS, in every run and restart, the changes
    made while the failure-free run reads and the server restarted under the run under kills."""
    from e2e import servers
    from e2e.certs import Pki

    server = servers.start_postgres(tmp_path / "pg", tls=Pki(tmp_path / "pki"))
    try:
        with psycopg.connect(server.conninfo, autocommit=True) as conn:
            conn.execute("CREATE DATABASE shop")
        conninfo, source = live_cdc.cdc_source(server, "shop")
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(jobs.POSTGRES_TABLES[0])
        files = server.tls
        tls = {
            "mode": "verify-full",
            "caFile": str(files.ca),
            "certFile": str(files.cert),
            "keyFile": str(files.key),
        }
        database = {"port": server.port, "user": server.user, "database": "shop", "tls": tls}
        per_row = {
            "type": "postgres",
            "config": {
                **database,
                "table": "counts",
                "columns": ["key", "value"],
                "mode": "upsert",
                "keys": ["key"],
            },
        }
        home = tmp_path / "job"
        job = jobs.prepare(home, jobs.postgres_cdc({**source, "tls": tls}, per_row, bounded=False))
        # every change once in the file, and each row's last count in the table (3,000 rows inserted)
        cdc_chaos(
            job,
            tmp_path,
            etcd_server,
            capsys,
            server,
            conninfo,
            seed=63,
            cell="postgres-cdc-to-postgres-tls",
            committed=lambda changes: changes + 3000,
        )
    finally:
        server.close()


@pytest.mark.parametrize("mode", ["run"])  # the combiner is the same code under --etcd
def test_chaos_cell_final_counts_pre_aggregated(mode, tmp_path, etcd_server, capsys):
    """The fault point that always lands while partials are held at a durable epoch is in
    `tests/runtime/test_combiner.py` (it fails when partials miss the barrier)."""
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.final_count(home))
    seed = 60 + MODES.index(mode)
    result = chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=seed, extra=[FINAL_OUTPUT])
    check(result, capsys, f"final-count / {mode}", final_output=True)
    assert "committed records: 200 failure-free, 200 under kills" in result.out  # one per word


@pytest.mark.parametrize("mode", ["run"])  # the combiner is the same code under --etcd
def test_chaos_cell_window_averages_pre_aggregated(mode, tmp_path, etcd_server, capsys):
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.combined_windows(home))
    result = chaos(job, tmp_path, mode=mode, etcd_server=etcd_server, seed=70 + MODES.index(mode))
    check(result, capsys, f"combined-windows / {mode}")
    windows = {
        (e["k"], start)
        for events in jobs.combined_events().values()
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


def test_chaos_says_when_two_runs_of_a_job_may_differ_without_a_fault(tmp_path, etcd_server):
    home = tmp_path / "job"
    job = jobs.prepare(home, jobs.processing_windows(home))
    result = chaos(job, tmp_path, mode="run", etcd_server=etcd_server, seed=0, extra=("--allow-shallow",))
    assert result.code == 4, result.out + result.err
    timing = "  depends on timing: model.operators[1].window.time: processing time follows the wall clock\n"
    assert timing in result.out
    assert re.search(r"only failure-free: [1-9]\d*\n", result.out) and "missing:" not in result.out
    verdict = "verdict: cannot tell: two runs of this job may differ without any fault (docs/time.md)"
    assert verdict in result.out


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
    assert re.match(r"runner\.log \(pid \d+\)", waits[0]), result.err
    # the runner's supervisor: in its main thread's frames, or as the outermost frame of its task when
    # the sample caught it deep in an etcd call (two CI runs did: in the client's connect and in a get)
    runner = list(itertools.takewhile(lambda line: line.startswith("  "), waits[1:]))
    assert any("supervisor.py" in line for line in runner), result.err
    assert re.search(r"  thread MainThread: chaosfns\.py:\d+ stall <- ", result.err), result.err
    # the leader waits on them: for their status, to take its first barrier, or for its ACKs
    waits_on_tasks = r"  task run \d+: .*(coordinator_api\.py:\d+ (status|barrier)|epochs\.py:\d+ _take)"
    assert re.search(waits_on_tasks, result.err), result.err
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", result.err)]
    assert len(pids) >= 4 and not [p for p in pids if Path(f"/proc/{p}").exists()]
