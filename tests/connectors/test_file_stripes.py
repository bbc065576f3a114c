"""The file source's stripes: every line read exactly once by exactly one subtask, at any
parallelism, through snapshots joined by the checkpoint code and restored rescaled."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import orjson
import pytest

from nopstream.checkpoint import snapshots
from nopstream.checkpoint.formats import decode_segment
from nopstream.connectors import stripes
from nopstream.connectors.files import file_source
from nopstream.connectors.striped import StripedSource
from nopstream.errors import RestoreRefused
from nopstream.model.load import load_data
from nopstream.plan import compiler
from nopstream.records import TaskSnapshot

STRIPE = stripes.STRIPE_BYTES


def corpus(directory: Path, seed: int = 7) -> list[str]:
    """Files whose lines cross stripe edges every way: short lines, lines longer than a stripe,
    a line ending exactly at a stripe's end, empty lines, an empty file, no final newline."""
    rng = random.Random(seed)
    directory.mkdir()
    lines: list[str] = []
    for i in range(6):
        text = []
        size = 0
        target = rng.choice([0, 100, STRIPE - 1, 3 * STRIPE + 17, 5 * STRIPE])
        while size < target:
            n = rng.choice([0, 1, 9, 80, 2000, STRIPE + 5000])
            line = f"f{i}-{len(text)}-" + "x" * n
            text.append(line)
            size += len(line) + 1
        if i == 2 and text:  # a line that ends exactly where the second stripe starts
            filler = STRIPE - sum(len(t) + 1 for t in text[:1]) - 1
            text.insert(1, "y" * filler)
        data = "\n".join(text) + ("" if i == 3 else "\n") if text else ""
        (directory / f"part-{i}.txt").write_text(data)
        lines.extend(text)
    return lines


def read_some(source: StripedSource, rng: random.Random, most: int, sizes: list[int]) -> list[str]:
    """The lines of a random number (below `most`) of batches of random sizes (fewer at the end)."""
    got: list[str] = []
    for _ in range(rng.randrange(0, most)):
        batch = source.read(rng.choice(sizes))
        if batch is None:
            break
        got.extend(batch.records)
    return got


def read_all(source: StripedSource, batch: int = 50) -> list[str]:
    got: list[str] = []
    while (b := source.read(batch)) is not None:
        got.extend(b.records)
    return got


@pytest.mark.parametrize("parallelism", [1, 2, 3, 5, 8])
def test_the_subtasks_read_every_line_once(tmp_path, parallelism):
    expected = corpus(tmp_path / "in")
    config = {"path": str(tmp_path / "in" / "*.txt")}
    parts = [read_all(file_source(config, subtask=i, parallelism=parallelism)) for i in range(parallelism)]
    assert Counter(line for part in parts for line in part) == Counter(expected)
    if parallelism == 1:
        assert parts[0] == expected  # one subtask reads the files in order, each from its start


def test_the_subtasks_share_the_bytes_evenly_whatever_the_files(tmp_path):
    """Three files of 3 MiB over four subtasks (whole files by hash would leave one idle):
    each subtask reads a quarter, give or take a stripe per file."""
    directory = tmp_path / "in"
    directory.mkdir()
    for i in range(3):
        (directory / f"{i}.txt").write_text(("word " * 19 + "word\n") * (3 * (1 << 20) // 100))
    config = {"path": str(directory / "*.txt")}
    shares = [
        sum(len(line) + 1 for line in read_all(file_source(config, subtask=i, parallelism=4), 1000))
        for i in range(4)
    ]
    total = sum(shares)
    assert all(abs(share - total / 4) <= 3 * STRIPE for share in shares), shares


def plan(parallelism: int, path: str):
    model = {
        "jobId": "stripes",
        "parallelism": parallelism,
        "model": {
            "sources": [{"id": "src", "type": "file", "config": {"path": path}}],
            "operators": [{"id": "up", "type": "map", "fn": "builtins:str"}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    return compiler.compile_model(load_data(model), backend="local").partitioned


def checkpoint(plan_, states: list[dict], epoch: int) -> dict[str, object]:
    """The source segments of every subtask's state at `epoch`, as storage holds them."""
    segments: dict[str, object] = {}
    for subtask, state in enumerate(states):
        parts = snapshots.split(
            plan_, vertex_id="src", subtask=subtask, epoch=epoch,
            state=TaskSnapshot(operators={}, source=state), source_id="src", sink_ids=[],
        )  # fmt: skip
        segments.update({p: decode_segment(data, path=p, epoch=epoch)[1] for p, data in parts.items()})
    return segments


def joined(plan_, segments: dict[str, object], subtask: int, epoch: int) -> dict:
    state = snapshots.join(
        plan_, vertex_id="src", subtask=subtask, epoch=epoch, segments=segments,
        operator_ids=[], source_id="src", sink_ids=[], shards=None, rescaled=True,
    ).source  # fmt: skip
    assert state is not None
    return state


@pytest.mark.parametrize(("before", "after"), [(3, 3), (3, 5), (4, 2), (2, 1), (1, 4)])
def test_a_restore_from_every_subtasks_snapshots_reads_each_stripe_once(tmp_path, before, after):
    """Each subtask reads some batches and snapshots (a barrier), then more that the checkpoint
    does not hold (lost in a crash); the restored subtasks of the new parallelism read what the
    checkpoint did not hold, each line exactly once, at two checkpoints in a row."""
    expected = corpus(tmp_path / "in", seed=before * 10 + after)
    path = str(tmp_path / "in" / "*.txt")
    old, new = plan(before, path), plan(after, path)
    rng = random.Random(before * 100 + after)
    kept: list[str] = []
    sources = [file_source({"path": path}, subtask=i, parallelism=before) for i in range(before)]
    states = []
    for source in sources:
        kept.extend(read_some(source, rng, 40, [1, 7, 50]))
        states.append(orjson.loads(orjson.dumps(source.snapshot())))
        source.read(20)  # read after the barrier: not in the checkpoint, read again after the restore
        source.close()
    segments = checkpoint(old, states, 8)
    restored = []
    for i in range(after):
        source = file_source({"path": path}, subtask=i, parallelism=after)
        source.restore(joined(new, segments, i, 8))
        restored.append(source)
    # a second checkpoint of the restored subtasks, then a second restore at the old parallelism
    states = []
    for source in restored:
        kept.extend(read_some(source, rng, 30, [3, 50]))
        states.append(orjson.loads(orjson.dumps(source.snapshot())))
        source.close()
    segments = checkpoint(new, states, 9)
    for i in range(before):
        source = file_source({"path": path}, subtask=i, parallelism=before)
        source.restore(joined(old, segments, i, 9))
        kept.extend(read_all(source))
    assert Counter(kept) == Counter(expected)


def test_a_checkpoint_of_one_split_per_file_resumes_where_its_cursor_was(tmp_path):
    """A snapshot written before stripes (a file's cursor keyed by its path, finished files by name)
    restores: the finished file is not read again, the begun one goes on from its cursor."""
    directory = tmp_path / "in"
    directory.mkdir()
    lines = [f"line {i} " + "z" * (i % 300) for i in range(6000)]
    begun, whole = directory / "a.txt", directory / "b.txt"
    begun.write_text("\n".join(lines) + "\n")
    whole.write_text("done\n")
    cursor = sum(len(line) + 1 for line in lines[:4321])
    state = {"cursors": {str(begun): cursor, str(whole): 5}, "finished": [str(whole)]}
    got: list[str] = []
    for i in range(3):
        source = file_source({"path": str(directory / "*.txt")}, subtask=i, parallelism=3)
        source.restore(state)
        got.extend(read_all(source))
    assert Counter(got) == Counter(lines[4321:])


def test_a_checkpoint_with_other_stripes_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    source = file_source({"path": str(tmp_path / "*.txt")}, subtask=0, parallelism=1)
    with pytest.raises(RestoreRefused) as refused:
        source.restore({"stripeBytes": 1 << 20, "cursors": {}, "done": {}})
    assert str(refused.value) == (
        f"the source's checkpoint cuts its input into stripes of 1048576 bytes; this version of"
        f" nopstream reads stripes of {STRIPE} bytes: start over with --fresh"
    )


def begun_file(tmp_path: Path) -> tuple[Path, dict]:
    """A file of 100,000 lines and a subtask's snapshot that has begun it."""
    path = tmp_path / "a.txt"
    path.write_text("".join(f"{i:08d}\n" for i in range(100_000)))
    source = file_source({"path": str(tmp_path / "*.txt")}, subtask=0, parallelism=2)
    for _ in range(3):
        source.read(1000)
    state = orjson.loads(orjson.dumps(source.snapshot()))
    source.close()
    return path, state


def test_a_begun_stripe_whose_file_shrank_is_refused_naming_it(tmp_path):
    path, state = begun_file(tmp_path)
    ((split, cursor),) = state["cursors"].items()
    path.write_text(path.read_text()[: cursor // 2])
    again = file_source({"path": str(tmp_path / "*.txt")}, subtask=0, parallelism=2)
    with pytest.raises(RestoreRefused) as refused:
        again.restore(state)
    assert str(refused.value) == (
        f"split '{split}' changed under its cursor: the file has {cursor // 2} bytes, the cursor is at"
        f" byte {cursor}: a file being read must not shrink or be replaced (docs/runtime.md)"
    )


def test_a_file_replaced_between_a_restore_and_its_first_read_fails_the_read(tmp_path):
    path, state = begun_file(tmp_path)
    again = file_source({"path": str(tmp_path / "*.txt")}, subtask=0, parallelism=2)
    again.restore(state)  # the file is still the one begun
    path.write_text("".join(f"{i + 1:08d}\n" for i in range(100_000)))
    with pytest.raises(RuntimeError) as failed:
        again.read(10)
    assert str(failed.value) == f"file '{path}' changed under a running job: its first 4096 bytes differ"


def stamped_corpus(directory: Path, seed: int) -> dict[str, int]:
    """Two files of JSON lines over several stripes, timestamps wandering; id -> timestamp."""
    rng = random.Random(seed)
    directory.mkdir()
    stamps: dict[str, int] = {}
    for f in range(2):
        lines, ts = [], 0
        while sum(map(len, lines)) < 3 * STRIPE + 1000:
            ts += rng.randrange(-50, 60)
            record = {"id": f"{f}-{len(lines)}", "ts": ts, "pad": "x" * rng.randrange(200)}
            stamps[record["id"]] = ts
            lines.append(orjson.dumps(record).decode() + "\n")
        (directory / f"part-{f}.jsonl").write_text("".join(lines))
    return stamps


def stripe_highs(directory: Path) -> dict[str, int]:
    """id -> the highest timestamp of the lines before it in its own stripe (the one it starts in)."""
    out: dict[str, int] = {}
    for path in sorted(directory.glob("*.jsonl")):
        highs: dict[int, int] = {}
        offset = 0
        for line in path.read_bytes().splitlines(keepends=True):
            record = orjson.loads(line)
            stripe = offset // STRIPE
            out[record["id"]] = highs.get(stripe, -(2**63))
            highs[stripe] = max(highs.get(stripe, -(2**63)), record["ts"])
            offset += len(line)
    return out


@pytest.mark.parametrize(("before", "after"), [(1, 3), (2, 2), (3, 1), (4, 2)])
def test_each_stripe_keeps_its_own_event_time_through_batches_and_rescaled_restores(tmp_path, before, after):
    """What a line is judged late against (its stripe's high before it) is the same whatever the
    parallelism, the batch sizes, and a restore at another parallelism in the middle; and a subtask's
    floor stays at the minimum while a stripe of its is not begun."""
    stamps = stamped_corpus(tmp_path / "in", seed=before * 10 + after)
    want = stripe_highs(tmp_path / "in")
    path = str(tmp_path / "in" / "*.jsonl")
    old, new = plan(before, path), plan(after, path)
    rng = random.Random(before + after)
    got: dict[str, int] = {}

    def read(source: StripedSource, batches: int | None) -> None:
        while batches is None or batches > 0:
            batch = source.read(rng.choice([1, 9, 300]))
            if batch is None:
                assert source.event_time_floor() is None  # nothing left to hold event time back
                return
            ids = [r["id"] for r in batch.records]
            got.update(zip(ids, source.split_highs([stamps[i] for i in ids]), strict=True))
            batches = None if batches is None else batches - 1

    states = []
    for i in range(before):
        source = file_source({"path": path, "format": "jsonl"}, subtask=i, parallelism=before)
        assert source.event_time_floor() == -(2**63)  # nothing begun: every stripe may hold anything
        read(source, 1)
        assert source.event_time_floor() == -(2**63)  # the second file is not begun
        read(source, rng.randrange(5, 40))
        states.append(orjson.loads(orjson.dumps(source.snapshot())))
        source.close()
    segments = checkpoint(old, states, 8)
    for i in range(after):
        source = file_source({"path": path, "format": "jsonl"}, subtask=i, parallelism=after)
        source.restore(joined(new, segments, i, 8))
        read(source, None)
        source.close()
    assert got == want
