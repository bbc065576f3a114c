"""The s3 source on a real MinIO server: the file source's stripes over S3 objects, read by
ranged GETs of at most `READ_BYTES`, every line exactly once at any parallelism and
through rescaled restores, and an object changed under its cursor refused or failed."""

from __future__ import annotations

import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from nopstream.connectors import s3 as s3_connector
from nopstream.connectors.s3 import s3_source
from nopstream.errors import RestoreRefused, StorageError
from nopstream.records import SourceReader
from nopstream.s3 import S3Storage
from tests.chaos import jobs
from tests.conftest import ROOT, run_nopstream
from tests.connectors.test_file_stripes import STRIPE, checkpoint, corpus, joined, plan, read_all, read_some

RULE = "an object being read must not change (docs/runtime.md)"


@pytest.fixture
def inputs(minio_server, minio_client, bucket, monkeypatch):
    """Put objects under `in/` of the test's bucket; make s3 sources of them."""
    monkeypatch.setenv("NOPSTREAM_S3_ACCESS_KEY", minio_server.access_key)
    monkeypatch.setenv("NOPSTREAM_S3_SECRET_KEY", minio_server.secret_key)

    class Inputs:
        def __init__(self) -> None:
            self.config = {"bucket": bucket, "prefix": "in/", "endpoint": minio_server.url}

        def put(self, name: str, data: bytes) -> None:
            minio_client.put_object(bucket, f"in/{name}", io.BytesIO(data), len(data))

        def upload(self, directory: Path) -> None:
            for path in sorted(directory.iterdir()):
                self.put(path.name, path.read_bytes())

        def source(self, subtask: int, parallelism: int) -> SourceReader:
            return s3_source(self.config, subtask=subtask, parallelism=parallelism)

    return Inputs()


@pytest.mark.parametrize("parallelism", [1, 2, 3, 5])
def test_the_subtasks_read_every_line_of_the_objects_once(tmp_path, inputs, parallelism):
    expected = corpus(tmp_path / "in")
    inputs.upload(tmp_path / "in")
    parts = [read_all(inputs.source(i, parallelism)) for i in range(parallelism)]
    assert Counter(line for part in parts for line in part) == Counter(expected)
    if parallelism == 1:
        assert parts[0] == expected


def test_each_subtask_fetches_its_share_of_an_object_a_bounded_range_at_a_time(inputs, monkeypatch):
    """One object of 12 MiB over four subtasks: each GETs about a quarter of its bytes (one
    subtask used to read it whole, into memory), no GET longer than `READ_BYTES`."""
    line = b"word " * 19 + b"word\n"
    inputs.put("big.txt", line * (12 * (1 << 20) // len(line)))
    fetched: list[tuple[int, int]] = []
    get_range = S3Storage.get_range

    def recorded(self, path, offset, length=0, *, etag=None):
        data = get_range(self, path, offset, length, etag=etag)
        fetched.append((length, len(data)))
        return data

    monkeypatch.setattr(S3Storage, "get_range", recorded)
    shares = []
    for i in range(4):
        fetched.clear()
        lines = read_all(inputs.source(i, 4), 1000)
        assert fetched and all(0 < length <= s3_connector.READ_BYTES for length, _ in fetched), fetched
        shares.append((sum(len(x) + 1 for x in lines), sum(n for _, n in fetched)))
    total = sum(read for read, _ in shares)
    assert total == 12 * (1 << 20) // len(line) * len(line)
    for read, got in shares:
        assert abs(read - total / 4) <= 2 * STRIPE, shares
        assert got <= read + 2 * s3_connector.READ_BYTES, shares  # its own stripes, not the object


def test_many_small_objects_cost_one_get_each_and_no_head(inputs, monkeypatch):
    """30 objects of one stripe each over three subtasks: the listing gives sizes and ETags,
    so each object is fetched once, by the subtask that owns it, and nothing is HEADed."""
    expected = []
    for i in range(30):
        lines = [f"o{i}-{j}" for j in range(100)]
        inputs.put(f"{i:02d}.txt", ("\n".join(lines) + "\n").encode())
        expected += lines
    calls: Counter[str] = Counter()
    for method in ("get_range", "stat"):
        original = getattr(S3Storage, method)

        def counted(self, *args, _original=original, _method=method, **kwargs):
            calls[_method] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(S3Storage, method, counted)
    got = [line for i in range(3) for line in read_all(inputs.source(i, 3))]
    assert Counter(got) == Counter(expected)
    assert calls == Counter({"get_range": 30}), calls


@pytest.mark.parametrize(("before", "after"), [(3, 5), (4, 2)])
def test_a_restore_from_every_subtasks_snapshots_reads_each_stripe_of_the_objects_once(
    tmp_path, inputs, before, after
):
    expected = corpus(tmp_path / "in", seed=before * 10 + after)
    inputs.upload(tmp_path / "in")
    old, new = plan(before, "in"), plan(after, "in")
    rng = random.Random(before * 100 + after)
    kept: list[str] = []
    states = []
    for i in range(before):
        source = inputs.source(i, before)
        kept.extend(read_some(source, rng, 40, [1, 7, 50]))
        states.append(orjson.loads(orjson.dumps(source.snapshot())))
        source.read(20)  # after the barrier: lost, read again after the restore
        source.close()
    segments = checkpoint(old, states, 8)
    for i in range(after):
        source = inputs.source(i, after)
        source.restore(joined(new, segments, i, 8))
        kept.extend(read_all(source))
    assert Counter(kept) == Counter(expected)


def test_a_checkpoint_of_one_split_per_object_resumes_where_its_cursor_was(inputs, minio_client, bucket):
    """A snapshot of the s3 source before stripes (every object's cursor by its key, 0 for one
    not begun, the finished ones by name, the ETags of those begun) restores at parallelism 3."""
    lines = [f"line {i} " + "z" * (i % 300) for i in range(6000)]
    inputs.put("a.txt", ("\n".join(lines) + "\n").encode())
    inputs.put("b.txt", b"done\n")
    inputs.put("c.txt", b"new 1\nnew 2\n")
    cursor = sum(len(line) + 1 for line in lines[:4321])
    etag = minio_client.stat_object(bucket, "in/a.txt").etag
    state = {
        "cursors": {"in/a.txt": cursor, "in/b.txt": 5, "in/c.txt": 0},
        "finished": ["in/b.txt"],
        "etags": {"in/a.txt": etag},
    }
    got: list[str] = []
    for i in range(3):
        source = inputs.source(i, 3)
        source.restore(state)
        got.extend(read_all(source))
    assert Counter(got) == Counter([*lines[4321:], "new 1", "new 2"])


def begun(inputs) -> tuple[dict, str, int]:
    """A subtask's snapshot with an object begun: (state, its split, its cursor)."""
    inputs.put("a.txt", b"".join(b"%08d\n" % i for i in range(1_000_000)))
    source = inputs.source(0, 2)
    for _ in range(3):
        source.read(1000)
    state = orjson.loads(orjson.dumps(source.snapshot()))
    source.close()
    ((split, cursor),) = state["cursors"].items()
    return state, split, cursor


def test_a_begun_object_replaced_or_deleted_is_refused_naming_its_split(inputs, minio_client, bucket):
    state, split, cursor = begun(inputs)
    etag = state["etags"]["in/a.txt"]
    inputs.put("a.txt", b"".join(b"%08d\n" % (i + 1) for i in range(1_000_000)))  # same size, other bytes
    with pytest.raises(RestoreRefused) as refused:
        inputs.source(0, 2).restore(state)
    assert str(refused.value) == f"split '{split}' changed under its cursor (its ETag is not {etag}): {RULE}"
    minio_client.remove_object(bucket, "in/a.txt")
    with pytest.raises(RestoreRefused) as refused:
        inputs.source(0, 2).restore(state)
    assert str(refused.value) == f"split '{split}' is gone, its cursor is at byte {cursor}: {RULE}"


def test_an_object_replaced_while_it_is_read_fails_the_read(inputs, bucket):
    state, _, _ = begun(inputs)
    source = inputs.source(0, 2)
    source.restore(state)
    source.read(1000)
    inputs.put("a.txt", b"".join(b"%08d\n" % (i + 7) for i in range(1_000_000)))
    with pytest.raises(StorageError) as failed:
        read_all(source, 5000)
    assert str(failed.value).startswith(
        f"s3://{bucket}/in/a.txt changed under a running job: its ETag is no longer"
    )


def test_an_object_replaced_under_a_running_job_fails_the_run_naming_it(
    tmp_path, inputs, minio_server, minio_client, bucket
):
    """A user overwrites an object while a job reads it: the run stops, naming the object and
    the rule, and what was committed stays; a start after refuses the changed split."""
    home = tmp_path / "job"
    words = [f"w{i}" for i in range(50)]
    rng = random.Random(17)
    # 25 stripes: a subtask GETs its next stretch long after the first durable epoch
    inputs.put("big.txt", "".join(" ".join(rng.choices(words, k=600)) + "\n" for _ in range(2700)).encode())
    model = {
        "jobId": "replaced",
        "parallelism": 2,
        "checkpoint": {"intervalMs": 200, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [{"id": "lines", "type": "s3", "config": inputs.config}],
            "operators": jobs.rolling_word_count(emit="final"),
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    model["model"]["operators"][0]["fn"] = "slowfns:split"
    job = jobs.prepare(home, model)
    # 5 ms a line: the run reads for about 7 s, a busy machine's poll below sees an epoch in it
    (home / "slowfns.py").write_text(
        "import time\n\ndef split(line):\n    time.sleep(0.005)\n    return line.split()\n"
    )
    etag = minio_client.stat_object(bucket, "in/big.txt").etag
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(home)]),
        "NOPSTREAM_S3_ACCESS_KEY": minio_server.access_key,
        "NOPSTREAM_S3_SECRET_KEY": minio_server.secret_key,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", str(job)], cwd=home, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not any(
            cursor
            for manifest in home.glob("cp/checkpoint/*/*/*/_manifest.json")
            for state in json.loads(manifest.read_text())["sources"].values()
            for cursor in state.get("cursors", {}).values()
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "no durable epoch began the object"
            time.sleep(0.02)
        inputs.put("big.txt", b"other words\n" * 60_000)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # the reader's next GET of the replaced object fails (If-Match), and the recovery refuses it
    assert proc.returncode == 1, err
    assert "recovering: task replaced/main/lines/" in err
    refusal = (
        rf"job 'replaced' cannot restore: task replaced/main/lines/\d: split 'in/big\.txt#\d+' changed under"
        rf" its cursor \(its ETag is not {etag}\): an object being read must not change \(docs/runtime\.md\)"
    )
    assert re.search(refusal, err), err
    assert "Traceback" not in err
    assert not list((home / "out").glob("*.jsonl"))  # final counts: nothing was due before the end
    again = run_nopstream("run", str(job), cwd=home, env=env)
    assert again.code == 1 and re.search(refusal, again.err), again.err


def test_an_object_replaced_between_a_restore_and_its_first_read_fails_the_read(inputs, bucket):
    state, _, _ = begun(inputs)
    source = inputs.source(0, 2)
    source.restore(state)  # the object is still the one begun
    inputs.put("a.txt", b"".join(b"%08d\n" % (i + 3) for i in range(1_000_000)))
    with pytest.raises(StorageError) as failed:
        source.read(10)
    etag = state["etags"]["in/a.txt"]
    assert (
        str(failed.value)
        == f"s3://{bucket}/in/a.txt changed under a running job: its ETag is no longer {etag}"
    )
