"""Parquet files and S3 objects, read by row groups spread over the subtasks and written as one Parquet
file per committed transaction: exact, written and read back by the test with pyarrow itself; values
of every Parquet type as records hold them; rescaled restores mid-group; damaged files and records
that do not fit the schema refused (or set aside) with words that name them, nothing written."""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nopstream.connectors.files import file_source
from nopstream.errors import RestoreRefused
from tests.chaos import jobs
from tests.checkpointing.test_faults import run_job
from tests.connectors.test_csv import csv_job as totals_job  # the same totals, in other formats
from tests.connectors.test_csv import refused_by_validation, totals_through_objects


def orders(rng: random.Random, rows: int, first: int = 0) -> list[dict]:
    return [
        {"order": first + i, "user": f"u{rng.randrange(30)}", "amount": rng.randrange(1, 1000)}
        for i in range(rows)
    ]


def write_orders(path: Path, records: list[dict], group: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=group)


def read_all(source, batch: int = 97) -> list:
    out = []
    while (got := source.read(batch)) is not None:
        out += got.records
    return out


def canonical(records: list) -> Counter:
    return Counter(json.dumps(r, sort_keys=True) for r in records)


def parquet_dir(path: Path) -> tuple[list[dict], list[pa.Schema], list[int]]:
    """Every row of the Parquet files in `path` (read by pyarrow), their schemas, their row groups."""
    files = sorted(path.glob("*.parquet"))
    metas = [pq.ParquetFile(f).metadata for f in files]
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    return rows, [pq.read_schema(f) for f in files], [m.num_row_groups for m in metas]


def totals(records: list[dict]) -> Counter:
    sums: Counter = Counter()
    for o in records:
        sums[o["user"]] += o["amount"]
    return Counter(json.dumps({"key": u, "value": v}, sort_keys=True) for u, v in sums.items())


def columns(types: dict[str, str]) -> list[dict[str, str]]:
    """A `parquet.schema`: the columns in the order given."""
    return [{"name": name, "type": kind} for name, kind in types.items()]


PARQUET_OUT = {
    "format": "parquet",
    "parquet": {"schema": columns({"key": "string", "value": "int64"}), "rowGroupRows": 7},
}


@pytest.mark.parametrize("parallelism", [1, 2, 3, 5])
def test_the_subtasks_read_every_row_of_every_group_once(tmp_path, parallelism):
    rng = random.Random(parallelism)
    expected = []
    for f, (rows, group) in enumerate([(2_000, 300), (10, 100), (0, 100), (777, 1)]):
        part = orders(rng, rows, first=len(expected))
        write_orders(tmp_path / f"in/o{f}.parquet", part, group)
        expected += part
    config = {"path": str(tmp_path / "in/*.parquet"), "format": "parquet"}
    parts = [read_all(file_source(config, subtask=i, parallelism=parallelism)) for i in range(parallelism)]
    assert canonical([r for p in parts for r in p]) == canonical(expected)
    if parallelism > 1:  # shared: no subtask reads everything
        assert all(len(p) < len(expected) for p in parts)


def test_a_restore_mid_group_at_another_parallelism_reads_each_row_once(tmp_path):
    """Two subtasks read part of their groups and snapshot; three subtasks restore from both
    snapshots: the rows before the cursors and after them, together, are the files' rows once."""
    rng = random.Random(7)
    expected = orders(rng, 3_000)
    write_orders(tmp_path / "in/a.parquet", expected[:1_800], 250)
    write_orders(tmp_path / "in/b.parquet", expected[1_800:], 400)
    config = {"path": str(tmp_path / "in/*.parquet"), "format": "parquet"}
    before, states = [], []
    for i in range(2):
        source = file_source(config, subtask=i, parallelism=2)
        for _ in range(8):  # groups of 250 rows are read in batches of 97, 97, 56: mid-group
            before += source.read(97).records
        states.append(source.snapshot())
    joined = {
        "rowGroups": True,
        "cursors": {k: v for s in states for k, v in s["cursors"].items()},
        "eventTimes": {},
        "done": {k: v for s in states for k, v in s["done"].items()},
        "heads": {k: v for s in states for k, v in s["heads"].items()},
    }
    assert joined["cursors"], "the snapshots were taken mid-group"
    after = []
    for i in range(3):
        source = file_source(config, subtask=i, parallelism=3)
        source.restore(joined)
        after += read_all(source)
    assert canonical(before + after) == canonical(expected)
    assert len(before + after) == len(expected)


def test_a_restore_is_refused_when_a_begun_file_was_replaced_or_read_as_lines(tmp_path):
    rng = random.Random(8)
    write_orders(tmp_path / "in/a.parquet", orders(rng, 1_000), 500)
    config = {"path": str(tmp_path / "in/*.parquet"), "format": "parquet"}
    source = file_source(config, subtask=0, parallelism=1)
    source.read(100)
    state = source.snapshot()
    write_orders(tmp_path / "in/a.parquet", orders(rng, 1_000), 500)
    with pytest.raises(RestoreRefused) as replaced:
        file_source(config, subtask=0, parallelism=1).restore(state)
    split = f"{tmp_path}/in/a.parquet#0"
    assert str(replaced.value).startswith(f"split '{split}' changed under its cursor: its file's first")
    (tmp_path / "in/a.parquet").unlink()
    with pytest.raises(RestoreRefused) as gone:
        file_source(config, subtask=0, parallelism=1).restore(state)
    rule = "a file being read must not shrink or be replaced (docs/runtime.md)"
    assert str(gone.value) == f"split '{split}' is gone: {rule}"
    lines = {"path": str(tmp_path / "in/*.parquet"), "format": "jsonl"}
    with pytest.raises(RestoreRefused) as other:
        file_source(lines, subtask=0, parallelism=1).restore(state)
    assert str(other.value) == (
        "the source's checkpoint read its objects as Parquet; this source reads lines: start over"
        " with --fresh"
    )


def test_every_parquet_type_reads_as_records_hold_it(tmp_path):
    moment = datetime.datetime(2026, 12, 5, 13, 14, 15, 678_901, tzinfo=datetime.UTC)
    table = pa.table(
        {
            "ts_us": pa.array([moment, None], pa.timestamp("us", tz="UTC")),
            "ts_ns": pa.array([1_764_940_455_678_901_234, -1], pa.timestamp("ns")),
            "day": pa.array([datetime.date(2026, 12, 5), datetime.date(1969, 12, 31)], pa.date32()),
            "at": pa.array([datetime.time(13, 14, 15, 500_000), None], pa.time64("us")),
            "price": pa.array([decimal.Decimal("12.30"), decimal.Decimal("-0.05")], pa.decimal128(10, 2)),
            "raw": pa.array([b"\x00\xffab", b""], pa.binary()),
            "big": pa.array([2**62, -(2**40)], pa.int64()),
            "ratio": pa.array([0.25, float("inf")], pa.float32()),
            "ok": pa.array([True, None], pa.bool_()),
            "tags": pa.array([["a", "b"], []], pa.list_(pa.string())),
            "where": pa.array(
                [{"x": 1, "y": b"z"}, None], pa.struct([("x", pa.int16()), ("y", pa.binary())])
            ),
            "attrs": pa.array([[("k", 1)], None], pa.map_(pa.string(), pa.int32())),
            "kind": pa.array(["red", "red"]).dictionary_encode(),
            "took": pa.array([1_500, 2], pa.duration("ms")),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    source = file_source({"path": str(tmp_path / "t.parquet"), "format": "parquet"}, subtask=0, parallelism=1)
    moment_ms = (moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(
        milliseconds=1
    )
    assert read_all(source) == [
        {
            "ts_us": moment_ms,
            "ts_ns": 1_764_940_455_678,
            "day": "2026-12-05",
            "at": "13:14:15.500000",
            "price": "12.30",
            "raw": base64.b64encode(b"\x00\xffab").decode(),
            "big": 2**62,
            "ratio": 0.25,
            "ok": True,
            "tags": ["a", "b"],
            "where": {"x": 1, "y": "eg=="},
            "attrs": {"k": 1},
            "kind": "red",
            "took": 1_500,
        },
        {
            "ts_us": None,
            "ts_ns": 0,
            "day": "1969-12-31",
            "at": None,
            "price": "-0.05",
            "raw": "",
            "big": -(2**40),
            "ratio": float("inf"),
            "ok": None,
            "tags": [],
            "where": None,
            "attrs": None,
            "kind": "red",
            "took": 2,
        },
    ]
    projected = {
        "path": str(tmp_path / "t.parquet"),
        "format": "parquet",
        "parquet": {"columns": ["big", "ok"]},
    }
    assert read_all(file_source(projected, subtask=0, parallelism=1)) == [
        {"big": 2**62, "ok": True},
        {"big": -(2**40), "ok": None},
    ]


def test_parquet_files_into_parquet_files_with_the_schema_and_row_groups_given(tmp_path):
    home = tmp_path / "job"
    rng = random.Random(11)
    records = orders(rng, 20_000)
    write_orders(home / "in/a.parquet", records[:12_000], 1_000)
    write_orders(home / "in/b.parquet", records[12_000:], 3_000)
    source = {"type": "file", "config": {"path": "in/*.parquet", "format": "parquet"}}
    sink = {"type": "file", "config": {"path": "out", **PARQUET_OUT}}
    result = run_job(jobs.prepare(home, totals_job(source, sink)).parent)
    assert result.returncode == 0, result.stderr
    rows, schemas, groups = parquet_dir(home / "out")
    assert canonical(rows) == totals(records)
    assert {str(s) for s in schemas} == {"key: string\nvalue: int64"}
    assert sum(groups) > len(groups), "30 keys over two subtasks in row groups of 7 rows"


def test_parquet_objects_into_parquet_objects(tmp_path, minio_server, minio_client, bucket):
    rng = random.Random(12)
    records = orders(rng, 5_000)
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), buffer, row_group_size=700)
    data = buffer.getvalue()
    minio_client.put_object(bucket, "in/orders.parquet", io.BytesIO(data), len(data))
    parquet = {"format": "parquet"}
    out = totals_through_objects(tmp_path, minio_server, minio_client, bucket, parquet, PARQUET_OUT)
    assert {p.suffix for p in out.iterdir()} == {".parquet"}
    assert canonical(parquet_dir(out)[0]) == totals(records)


WRITTEN_TYPES = {
    "s": "string",
    "i": "int32",
    "l": "int64",
    "f": "float",
    "d": "double",
    "b": "boolean",
    "t": "timestamp",
    "day": "date",
    "raw": "binary",
    "doc": "json",
    "price": "decimal(10,2)",
}


def one_to_one_job(records: list[dict], schema: dict[str, str]) -> dict:
    return {
        "jobId": "typed",
        "checkpoint": {"intervalMs": 150},
        "model": {
            "sources": [{"id": "in", "type": "collection", "config": {"records": records}}],
            "operators": [],
            "sinks": [
                {
                    "id": "out",
                    "type": "file",
                    "config": {"path": "out", "format": "parquet", "parquet": {"schema": columns(schema)}},
                }
            ],
        },
    }


def test_every_column_type_is_written_as_its_parquet_type(tmp_path):
    record = {
        "s": "text",
        "i": -5,
        "l": 2**60,
        "f": 1,
        "d": 0.5,
        "b": False,
        "t": 1_764_940_455_678,
        "day": "2026-12-05",
        "raw": base64.b64encode(b"\x00\x01").decode(),
        "doc": {"a": [1, None]},
        "price": "12.30",
    }
    home = tmp_path / "job"
    result = run_job(jobs.prepare(home, one_to_one_job([record, {"s": None}], WRITTEN_TYPES)).parent)
    assert result.returncode == 0, result.stderr
    (path,) = sorted((home / "out").glob("*.parquet"))
    table = pq.read_table(path)
    assert str(table.schema) == (
        "s: string\ni: int32\nl: int64\nf: float\nd: double\nb: bool\nt: timestamp[ms, tz=UTC]\n"
        "day: date32[day]\nraw: binary\ndoc: string\nprice: decimal128(10, 2)"
    )
    assert table.to_pylist() == [
        {
            "s": "text",
            "i": -5,
            "l": 2**60,
            "f": 1.0,
            "d": 0.5,
            "b": False,
            "t": datetime.datetime(2025, 12, 5, 13, 14, 15, 678_000, tzinfo=datetime.UTC),
            "day": datetime.date(2026, 12, 5),
            "raw": b"\x00\x01",
            "doc": '{"a":[1,null]}',
            "price": decimal.Decimal("12.30"),
        },
        dict.fromkeys(WRITTEN_TYPES),
    ]
    # and read back by nopstream, as records hold them
    back = file_source({"path": str(path), "format": "parquet"}, subtask=0, parallelism=1)
    assert read_all(back)[0] == record | {"f": 1.0, "doc": '{"a":[1,null]}'}


@pytest.mark.parametrize(
    ("record", "words"),
    [
        ({"l": 1.5}, "has l = 1.5, which is not int64"),
        ({"i": 2**40}, "has i = 1099511627776, which is not int32"),
        ({"b": 1}, "has b = 1, which is not boolean"),
        ({"s": 5}, "has s = 5, which is not string"),
        ({"day": "5 Dec 2026"}, 'has day = "5 Dec 2026", which is not date'),
        ({"raw": "not base64!"}, 'has raw = "not base64!", which is not base64 text'),
        ({"price": "12.345"}, 'has price = "12.345", which is not decimal(10,2)'),
        ({"t": "2026-12-05T00:00:00Z"}, 'has t = "2026-12-05T00:00:00Z", which is not timestamp'),
    ],
)
def test_a_value_that_does_not_fit_its_column_is_refused_before_anything_is_written(tmp_path, record, words):
    home = tmp_path / "job"
    good = {"s": "fine", "l": 1}
    result = run_job(jobs.prepare(home, one_to_one_job([good, good | record], WRITTEN_TYPES)).parent)
    assert result.returncode == 3, result.stderr
    shown = json.dumps(good | record, separators=(",", ":"), sort_keys=True)  # the plan sorts its keys
    expected = f"file sink 'out': the record {shown} {words} (rule: parquet.schema gives each column's type)"
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not [p for p in (home / "out").rglob("*") if p.is_file()]


def test_a_field_outside_the_schema_is_refused(tmp_path):
    home = tmp_path / "job"
    result = run_job(
        jobs.prepare(home, one_to_one_job([{"s": "a", "extra": 1, "more": 2}], {"s": "string"})).parent
    )
    assert result.returncode == 3, result.stderr
    assert (
        'file sink \'out\': the record {"extra":1,"more":2,"s":"a"} has fields that are not among'
        " parquet.schema: extra, more" in result.stderr
    ), result.stderr


def test_a_file_that_is_not_parquet_is_refused_or_set_aside(tmp_path):
    def model(on_error: str) -> dict:
        source = {
            "type": "file",
            "config": {"path": "in/*.parquet", "format": "parquet"},
            "onError": on_error,
        }
        dead = [{"id": "bad", "type": "file", "inputs": ["orders:dead-letter"], "config": {"path": "bad"}}]
        return {
            "jobId": f"bad-parquet-{on_error}",
            "parallelism": 2,
            "checkpoint": {"intervalMs": 150},
            "model": {
                "sources": [{"id": "orders", **source}],
                "operators": [],
                "sinks": [{"id": "out", "type": "file", "inputs": ["orders"], "config": {"path": "out"}}]
                + dead * (on_error == "dead-letter"),
            },
        }

    records = orders(random.Random(5), 100)
    for on_error in ("fail", "dead-letter"):
        home = tmp_path / on_error
        write_orders(home / "in/a.parquet", records, 30)
        (home / "in/b.parquet").write_text('{"not": "parquet"}\n')
        result = run_job(jobs.prepare(home, model(on_error)).parent)
        reason = (
            "object 'in/b.parquet' is not a Parquet file (Parquet magic bytes not found in footer. Either the"
            " file is corrupted or this is not a parquet file.) (rule: a source of format parquet reads"
            " Parquet files)"
        )
        if on_error == "fail":
            assert result.returncode == 3, result.stderr
            assert reason in result.stderr, result.stderr
            assert "Traceback" not in result.stderr
            continue
        assert result.returncode == 0, result.stderr
        out = [
            json.loads(line)
            for f in sorted((home / "out").glob("*.jsonl"))
            for line in f.read_text().splitlines()
        ]
        assert canonical(out) == canonical(records)
        letters = [
            json.loads(line)
            for f in sorted((home / "bad").glob("*.jsonl"))
            for line in f.read_text().splitlines()
        ]
        assert [(r["record"], r["error"]) for r in letters] == [("in/b.parquet#0", reason)], letters


def test_a_column_the_files_lack_is_refused_naming_the_file(tmp_path):
    home = tmp_path / "job"
    write_orders(home / "in/a.parquet", orders(random.Random(6), 10), 5)
    config = {"path": "in/*.parquet", "format": "parquet", "parquet": {"columns": ["user", "colour"]}}
    model = {
        "jobId": "columns",
        "model": {
            "sources": [{"id": "orders", "type": "file", "config": config}],
            "operators": [],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    result = run_job(jobs.prepare(home, model).parent)
    assert result.returncode == 3, result.stderr
    assert (
        "object 'in/a.parquet' has no column colour (rule: parquet.columns names columns every object has)"
        in result.stderr
    ), result.stderr


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"format": "parquet"}, "format parquet needs parquet.schema (each column's type, in order)"),
        (
            {"format": "jsonl", "parquet": {"schema": columns({"a": "string"})}},
            "parquet goes with format parquet, not jsonl",
        ),
        (
            {"format": "parquet", "parquet": {"schema": columns({"a": "int"})}},
            "'int' is not a Parquet column type: one of string, int32, int64, float, double, boolean,"
            " timestamp, date, binary, json or decimal(P,S) with 1 <= P <= 38 and S <= P",
        ),
        (
            {"format": "parquet", "parquet": {"schema": columns({"a": "decimal(39,2)"})}},
            "'decimal(39,2)' is not a Parquet column type",
        ),
        (
            {"format": "parquet", "parquet": {"schema": columns({"a": "string"}), "columns": ["a"]}},
            "parquet.columns",
        ),
    ],
)
def test_parquet_settings_that_do_not_fit_are_refused_by_validation(config, message, tmp_path, nopstream):
    source = {"path": "in/*.parquet", "format": "parquet"}
    refused_by_validation(nopstream, tmp_path, source, config, message)
