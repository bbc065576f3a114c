"""Kafka -> Kafka jobs on a real broker: the exact committed output with a sink killed at each
named moment of its publish, with the broker restarted under a running job, and refused
at start on a missing topic.

The job is a rolling word count of a bounded 3-partition topic (part of it written in
transactions, some aborted) into a 2-partition topic; a faulty run's output (read_committed)
must be exactly what the counts of the committed input say: counts 1..N of each word, once.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections import Counter

import pytest

from tests.chaos.jobs import fill_kafka, rolling_word_count
from tests.checkpointing.test_every_start import second_while_first_runs
from tests.checkpointing.test_faults import prepare, run_job, run_with_fault
from tests.conftest import after_dashboard_line
from tests.kafka_util import Topics


def model(kafka: Topics, source: str, out: str) -> dict:
    return {
        "jobId": "kafka-job",
        "parallelism": 2,
        "checkpoint": {"intervalMs": 150, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [
                {
                    "id": "lines",
                    "type": "kafka",
                    "config": {"bootstrapServers": kafka.bootstrap, "topic": source, "bounded": True},
                }
            ],
            "operators": rolling_word_count("faultfns"),
            "sinks": [
                {
                    "id": "out",
                    "type": "kafka",
                    "config": {"bootstrapServers": kafka.bootstrap, "topic": out, "keyField": "key"},
                }
            ],
        },
    }


def rolling_counts(kafka: Topics, source: str, lines: int = 3000) -> Counter:
    """What a rolling word count of the source's committed lines (`fill_kafka`'s, `lines` a partition)
    publishes: counts 1..N of each word."""
    words = Counter(w for line in kafka.committed(source) for w in json.loads(line).split())
    assert "aborted" not in words and sum(words.values()) == 3 * lines * 6  # every committed line's words
    return Counter(
        json.dumps({"key": w, "value": v}, sort_keys=True) for w, n in words.items() for v in range(1, n + 1)
    )


@pytest.fixture
def source(kafka) -> str:
    return fill_kafka(kafka, random.Random(21), lines=3000)


@pytest.mark.parametrize(
    "point",
    [
        "after-stage@2",  # a sink dies at a barrier: the epoch's records in its snapshot, no manifest yet
        "before-publish@2",  # a sink dies after the manifest, before its Kafka transaction
        "mid-commit@1",  # a sink dies after the Kafka transaction committed, before it noted the marker
    ],
)
def test_a_sink_killed_at_each_moment_of_its_publish(point, tmp_path, kafka, source):
    expected = rolling_counts(kafka, source)
    out = kafka.create(point.split("@")[0], partitions=2)
    workdir = tmp_path / "faulty"
    prepare(workdir, model(kafka, source, out), {})
    codes, err = run_with_fault(workdir, point)
    assert codes == [0] and err.count("recovering: ") >= 1, err
    assert kafka.committed(out) == expected


def test_the_broker_restarted_under_a_running_job(tmp_path):
    from e2e import servers

    broker = servers.start_kafka(tmp_path / "broker")
    try:
        kafka = Topics(broker.bootstrap, "restart")
        source = fill_kafka(kafka, random.Random(21), lines=3000)
        expected = rolling_counts(kafka, source)
        out = kafka.create("restarted", partitions=2)
        workdir = tmp_path / "restart"
        prepare(workdir, model(kafka, source, out), {})

        def restart_once_output_arrives() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (workdir / "cp").exists():
                time.sleep(0.05)
            time.sleep(1.0)
            broker.restart()

        restarter = threading.Thread(target=restart_once_output_arrives)
        restarter.start()
        result = run_job(workdir, "--max-restarts", "30")
        restarter.join()
        assert result.returncode == 0, result.stderr
        assert kafka.committed(out) == expected
    finally:
        broker.stop()


@pytest.mark.parametrize("mode", ["run", "etcd"])
def test_a_job_whose_sink_topic_is_missing_is_refused_at_once(mode, tmp_path, kafka, source, request):
    workdir = tmp_path / "missing"
    prepare(workdir, model(kafka, source, "no-such-topic"), {})
    args = []
    if mode == "etcd":  # the task processes say it with exit code 5; the supervisor does not retry
        host, port = request.getfixturevalue("etcd_server").endpoint
        args = ["--etcd", f"{host}:{port}"]
    result = run_job(workdir, *args)
    assert result.returncode == 3, result.stderr
    # the sink is chained into the count tasks: whichever starts first reports it (by its
    # task id under `nopstream run`, by its process name under --etcd)
    said = after_dashboard_line(result.stderr) if mode == "run" else result.stderr
    assert re.fullmatch(
        r"job 'kafka-job' cannot start: task \S+: kafka sink 'out':"
        rf" topic 'no-such-topic' does not exist on {re.escape(kafka.bootstrap)} \(create it first\)\n",
        said,
    ), result.stderr
    assert "recovering: " not in result.stderr and "Traceback" not in result.stderr


def test_event_time_windows_over_the_kafka_record_timestamps_per_partition(tmp_path, kafka):
    """Each partition is in time order, but one is written before the other: read together by one
    subtask, the watermark must follow the slower partition or its records come late."""
    topic = kafka.create("events", partitions=2)
    rng = random.Random(23)
    expected: Counter = Counter()
    for p in range(2):
        stamps = [1 + i * 10 + p for i in range(20_000)]  # 0 would mean "now" to the producer
        keys = [f"k{rng.randrange(3)}" for _ in stamps]
        kafka.produce(topic, [{"k": k} for k in keys], partition=p, timestamp=stamps)
        expected.update((k, ts // 1000 * 1000) for k, ts in zip(keys, stamps, strict=True))
    out = kafka.create("windows")
    source = {"bootstrapServers": kafka.bootstrap, "topic": topic, "bounded": True}
    job = {
        "jobId": "kafka-time",
        "checkpoint": {"intervalMs": 200, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [
                {"id": "events", "type": "kafka", "config": source, "watermark": {"maxOutOfOrdernessMs": 0}}
            ],
            "operators": [
                {
                    "id": "per-second",
                    "type": "window",
                    "key": {"field": "k"},
                    "aggregate": {"kind": "count"},
                    "window": {"kind": "tumbling", "time": "event", "sizeMs": 1000},
                }
            ],
            "sinks": [
                {"id": "out", "type": "kafka", "config": {"bootstrapServers": kafka.bootstrap, "topic": out}}
            ],
        },
    }
    prepare(tmp_path / "time", job, {})
    result = run_job(tmp_path / "time")
    assert result.returncode == 0, result.stderr
    got = Counter()
    for record, n in kafka.committed(out).items():
        r = json.loads(record)
        got[(r["key"], r["start"])] += r["value"] * n
    assert got == expected


def test_an_epoch_of_megabytes_reaches_kafka_through_the_snapshot(tmp_path, kafka):
    """The outbox's records are in the sink's segments, not in its ACK or the manifest (an ACK
    over 1 MiB was refused by the control server: 413 on every attempt)."""
    out = kafka.create("big")
    lines = [f"{i:06d} " + "x" * 1000 for i in range(3000)]  # ~3 MB, read in well under an interval
    job = {
        "jobId": "kafka-big",
        "checkpoint": {"intervalMs": 5000, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [{"id": "lines", "type": "file", "config": {"path": "in/*.txt"}}],
            "sinks": [
                {
                    "id": "out",
                    "type": "kafka",
                    "config": {"bootstrapServers": kafka.bootstrap, "topic": out},
                }
            ],
        },
    }
    prepare(tmp_path / "big", job, {"part-0.txt": "\n".join(lines) + "\n"})
    result = run_job(tmp_path / "big")
    assert result.returncode == 0 and "recovering: " not in result.stderr, result.stderr
    assert kafka.committed(out) == Counter(json.dumps(line) for line in lines)
    manifest = max((tmp_path / "big" / "cp").rglob("_manifest.json"), key=lambda p: int(p.parent.name))
    assert manifest.stat().st_size < 100_000


def test_one_job_run_from_two_directories_into_one_topic_the_second_is_refused(tmp_path, kafka, source):
    """Kafka -> Kafka run twice at once from two working directories: one exited 0, and the topic
    held 5,542 duplicated and 484 missing records of 100,000. The sink output (the topic, on its
    cluster, for this job and sink) is held by the first run; the second is refused naming it."""
    expected = rolling_counts(kafka, source)
    out = kafka.create("twice", partitions=2)
    first, second = tmp_path / "one", tmp_path / "two"
    for home in (first, second):
        prepare(home, model(kafka, source, out), {})  # checkpoints of its own (cp/ in each)
    pid, code, err, refused = second_while_first_runs(first, second)
    assert refused.code == 1, refused.err
    held = f"sink 'out' output kafka topic '{out}' at {kafka.bootstrap} is held by nopstream run (pid {pid}, "
    assert held in refused.err
    assert code == 0, err
    assert kafka.committed(out) == expected


def test_values_that_do_not_decode_are_refused_or_set_aside(tmp_path, kafka):
    """A value that is not JSON refuses the run at once naming its partition and offset; with
    `onError: dead-letter` it is set aside with that reason and the job reads on."""
    topic = kafka.create("mixed", partitions=1)
    kafka.produce(topic, [{"n": n} for n in range(100)], partition=0)
    kafka.produce(topic, [b"{not json", b"\xff\xfe"], partition=0, raw=True)
    kafka.produce(topic, [{"n": n} for n in range(100, 150)], partition=0)
    out = kafka.create("good")

    def job(on_error: str) -> dict:
        source = {"bootstrapServers": kafka.bootstrap, "topic": topic, "bounded": True}
        sink = {"bootstrapServers": kafka.bootstrap, "topic": out}
        return {
            "jobId": f"mixed-{on_error}",
            "checkpoint": {"intervalMs": 150, "storage": {"local": {"path": "cp"}}},
            "model": {
                "sources": [{"id": "values", "type": "kafka", "config": source, "onError": on_error}],
                "operators": [],
                "sinks": [{"id": "out", "type": "kafka", "inputs": ["values"], "config": sink}]
                + [{"id": "bad", "type": "file", "inputs": ["values:dead-letter"], "config": {"path": "bad"}}]
                * (on_error == "dead-letter"),
            },
        }

    prepare(tmp_path / "fail", job("fail"), {})
    result = run_job(tmp_path / "fail")
    assert result.returncode == 3, result.stderr  # bad input: the same in every run, never retried
    assert f"partition 0 of topic '{topic}': the value at offset 100 is not JSON (" in result.stderr
    assert "recovering:" not in result.stderr and "Traceback" not in result.stderr
    assert kafka.committed(out) == Counter()
    prepare(tmp_path / "dead", job("dead-letter"), {})
    result = run_job(tmp_path / "dead")
    assert result.returncode == 0, result.stderr
    assert kafka.committed(out) == Counter(json.dumps({"n": n}) for n in range(150))
    letters = [
        json.loads(line)
        for f in sorted((tmp_path / "dead" / "bad").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert [(r["operator"], r["at"], r["record"]) for r in letters] == [
        ("values", None, "{not json"),
        ("values", None, "\ufffd\ufffd"),
    ]
    assert [r["error"].split(" (", 1)[0] for r in letters] == [
        f"partition 0 of topic '{topic}': the value at offset {n} is not JSON" for n in (100, 101)
    ]
