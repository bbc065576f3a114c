"""CSV files and S3 objects, read in stripes by several subtasks and written with a header per
committed object: exact, read back by Python's own `csv` module; lines that are not records of the
header refused or set aside; records the columns do not hold refused before anything is written."""

from __future__ import annotations

import csv
import io
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos import jobs
from tests.checkpointing.test_faults import run_job


def orders_csv(rng: random.Random, rows: int) -> tuple[str, list[dict]]:
    """A CSV text of orders (a header, quoted notes with commas and quotes) and its rows."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["user", "amount", "note"])
    orders = []
    for i in range(rows):
        order = {"user": f"u{rng.randrange(30)}", "amount": rng.randrange(1, 1000), "note": f'n{i}, "q"'}
        writer.writerow([order["user"], order["amount"], order["note"]])
        orders.append(order)
    return out.getvalue(), orders


def read_csv_dir(path: Path) -> Counter:
    """Every row of the CSV files in `path`, each file's header checked, as canonical JSON."""
    rows: Counter = Counter()
    for f in sorted(path.glob("*.csv")):
        reader = csv.DictReader(f.read_text().splitlines())
        assert reader.fieldnames == ["key", "value"]
        rows.update(json.dumps(r, sort_keys=True) for r in reader)
    return rows


def jsonl_records(path: Path) -> list:
    return [json.loads(line) for f in sorted(path.glob("*.jsonl")) for line in f.read_text().splitlines()]


def final_totals(orders: list[dict]) -> Counter:
    sums: Counter = Counter()
    for o in orders:
        sums[o["user"]] += o["amount"]
    return Counter(json.dumps({"key": u, "value": str(v)}, sort_keys=True) for u, v in sums.items())


def csv_job(source: dict, sink: dict) -> dict:
    return {
        "jobId": "csv",
        "parallelism": 3,
        "checkpoint": {"intervalMs": 150},
        "model": {
            "sources": [{"id": "orders", **source}],
            "operators": [
                {"id": "by-user", "type": "key_by", "key": {"field": "user"}},
                {
                    "id": "total",
                    "type": "aggregate",
                    "aggregate": {"kind": "sum", "field": "amount"},
                    "emit": "final",
                },
            ],
            "sinks": [{"id": "out", "parallelism": 2, **sink}],
        },
    }


CSV_IN = {"format": "csv", "csv": {"types": {"amount": "int"}}}
CSV_OUT = {"format": "csv", "csv": {"columns": ["key", "value"]}}


def test_csv_files_in_stripes_into_csv_files(tmp_path):
    """Two files of about 600 KiB (three stripes each, read by three subtasks: only the first stripe
    holds the header) into final totals: exact, each committed file with its header."""
    home = tmp_path / "job"
    (home / "in").mkdir(parents=True)
    orders = []
    for name, seed in (("a.csv", 1), ("b.csv", 2)):
        text, rows = orders_csv(random.Random(seed), 30_000)
        (home / "in" / name).write_text(text)
        orders += rows
    assert (home / "in" / "a.csv").stat().st_size > 2 * 256 * 1024
    source = {"type": "file", "config": {"path": "in/*.csv", **CSV_IN}}
    sink = {"type": "file", "config": {"path": "out", **CSV_OUT}}
    result = run_job(jobs.prepare(home, csv_job(source, sink)).parent)
    assert result.returncode == 0, result.stderr
    assert read_csv_dir(home / "out") == final_totals(orders)


def totals_through_objects(tmp_path, minio_server, minio_client, bucket, fmt: dict, out_fmt: dict) -> Path:
    """Run `csv_job` from the objects under in/ (read as `fmt` says) into objects under out/ (written
    as `out_fmt` says); a directory of what it committed, downloaded."""
    reach = {"bucket": bucket, "endpoint": minio_server.url}
    source = {"type": "s3", "config": {**reach, "prefix": "in/", **fmt}}
    sink = {"type": "s3", "config": {**reach, "prefix": "out/", **out_fmt}}
    env = {
        "NOPSTREAM_S3_ACCESS_KEY": minio_server.access_key,
        "NOPSTREAM_S3_SECRET_KEY": minio_server.secret_key,
    }
    result = run_job(jobs.prepare(tmp_path / "job", csv_job(source, sink)).parent, env=env)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "read"
    out.mkdir()
    for obj in minio_client.list_objects(bucket, prefix="out/"):
        body = minio_client.get_object(bucket, obj.object_name)
        (out / Path(obj.object_name).name).write_bytes(body.read())
        body.close()
        body.release_conn()
    return out


def test_csv_objects_into_csv_objects(tmp_path, minio_server, minio_client, bucket):
    text, orders = orders_csv(random.Random(3), 5_000)
    minio_client.put_object(bucket, "in/orders.csv", io.BytesIO(text.encode()), len(text.encode()))
    out = totals_through_objects(tmp_path, minio_server, minio_client, bucket, CSV_IN, CSV_OUT)
    assert {p.suffix for p in out.iterdir()} == {".csv"}
    assert read_csv_dir(out) == final_totals(orders)


def test_lines_that_are_not_records_of_the_header_are_refused_or_set_aside(tmp_path):
    good = "user,amount\nu1,5\nu2,7\n"
    bad = ["u3,1,extra\n", 'u4,"open\n', "u5,five\n"]
    text = good + "".join(bad) + "u6,9\n"

    def model(on_error: str) -> dict:
        source = {"type": "file", "config": {"path": "in/*.csv", **CSV_IN}, "onError": on_error}
        dead = [{"id": "bad", "type": "file", "inputs": ["orders:dead-letter"], "config": {"path": "bad"}}]
        return {
            "jobId": f"bad-csv-{on_error}",
            "checkpoint": {"intervalMs": 150},
            "model": {
                "sources": [{"id": "orders", **source}],
                "operators": [],
                "sinks": [{"id": "out", "type": "file", "inputs": ["orders"], "config": {"path": "out"}}]
                + dead * (on_error == "dead-letter"),
            },
        }

    for on_error in ("fail", "dead-letter"):
        home = tmp_path / on_error
        (home / "in").mkdir(parents=True)
        (home / "in" / "o.csv").write_text(text)
        result = run_job(jobs.prepare(home, model(on_error)).parent)
        if on_error == "fail":
            assert result.returncode == 3, result.stderr
            assert "Traceback" not in result.stderr and "recovering:" not in result.stderr
            at = len(good)
            assert (
                f"split 'in/o.csv#0' of 'in/o.csv': the line at byte {at} is not a CSV record of the"
                " header's 2 fields (it has 3) (rule: a source of format csv reads CSV lines)"
                in result.stderr
            ), result.stderr
            assert not list((home / "out").glob("*.jsonl"))
            continue
        assert result.returncode == 0, result.stderr
        out = jsonl_records(home / "out")
        assert sorted(out, key=lambda r: r["user"]) == [
            {"user": "u1", "amount": 5},
            {"user": "u2", "amount": 7},
            {"user": "u6", "amount": 9},
        ]
        letters = jsonl_records(home / "bad")
        reasons = sorted(r["error"].split(": the line at ")[1].split(" (rule")[0] for r in letters)
        assert reasons == [
            f"byte {len(good)} is not a CSV record of the header's 2 fields (it has 3)",
            f"byte {len(good) + len(bad[0])} is not a CSV record of the header's 2 fields"
            " (unexpected end of data)",
            f"byte {len(good) + len(bad[0]) + len(bad[1])} is not a CSV record of the header's 2 fields"
            " (field amount is 'five', not int)",
        ]


def test_a_record_the_columns_do_not_hold_is_refused_before_anything_is_written(tmp_path):
    home = tmp_path / "job"
    (home / "in").mkdir(parents=True)
    (home / "in" / "o.csv").write_text("user,amount\nu1,5\n")
    source = {"type": "file", "config": {"path": "in/*.csv", **CSV_IN}}
    sink = {"type": "file", "config": {"path": "out", "format": "csv", "csv": {"columns": ["user"]}}}
    model = {
        "jobId": "narrow",
        "checkpoint": {"intervalMs": 150},
        "model": {"sources": [{"id": "orders", **source}], "operators": [], "sinks": [{"id": "out", **sink}]},
    }
    result = run_job(jobs.prepare(home, model).parent)
    assert result.returncode == 3, result.stderr
    assert (
        'file sink \'out\': the record {"user":"u1","amount":5} has fields that are not among csv.columns:'
        " amount" in result.stderr
    ), result.stderr
    assert "Traceback" not in result.stderr
    assert not [p for p in (home / "out").rglob("*") if p.is_file()]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"format": "csv"}, "format csv needs csv.columns (the header, and the fields written in order)"),
        ({"format": "jsonl", "csv": {"columns": ["a"]}}, "csv goes with format csv, not jsonl"),
        (
            {"format": "csv", "csv": {"columns": ["a"], "types": {"a": "int"}}},
            "csv.types is for reading: a sink writes each value as its text",
        ),
    ],
)
def test_csv_settings_that_do_not_fit_are_refused_by_validation(config, message, tmp_path, nopstream):
    refused_by_validation(nopstream, tmp_path, {"path": "in/*.csv", "format": "csv"}, config, message)


def refused_by_validation(nopstream, tmp_path: Path, source: dict, sink: dict, message: str) -> None:
    """`nopstream validate` of a file job (source config `source`, file sink config `sink` into out/)
    exits non-zero saying `message`, without a traceback."""
    job = {
        "jobId": "format-settings",
        "model": {
            "sources": [{"id": "in", "type": "file", "config": source}],
            "operators": [],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out", **sink}}],
        },
    }
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    result = nopstream("validate", str(tmp_path / "job.yaml"))
    assert result.code != 0
    assert message in result.err, result.err
    assert "Traceback" not in result.err
