"""Testing a job from Python: records listed in the test as its input, its committed output collected.

    job = Job("wordcount")
    lines = testing.source(job, "lines", ["a b", "b"])
    out = testing.collect(lines.flat_map(split).key_by(fn=word).aggregate("count", id="count"), "out")
    job.run()
    assert sorted(out.records, key=str) == [...]

The source is an ordinary replayable source (`type: collection`: the records travel in
the plan, at most `MAX_COLLECTION`) and the sink an ordinary exactly-once file sink
into a directory of the test's; both are checkpointed like any other, so the same job
runs under `job.chaos(...)` and its kills.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nopstream.connectors import files
from nopstream.model.builder import JobBuilder, Stream
from nopstream.model.connectors import MAX_COLLECTION
from nopstream.model.spec import WatermarkSpec

__all__ = ["MAX_COLLECTION", "Collected", "collect", "source"]


def source(
    job: JobBuilder,
    id: str,
    records: Iterable[Any],
    *,
    splits: int = 1,
    parallelism: int | None = None,
    watermark: WatermarkSpec | None = None,
) -> Stream:
    """A source that reads `records` (JSON values: numbers, strings, lists, mappings) in `splits` splits,
    split `n` taking the records `n`, `n + splits`, ..."""
    config = {"records": list(records), "splits": splits}
    return job.source(id, "collection", config=config, parallelism=parallelism, watermark=watermark)


@dataclass(frozen=True)
class Collected:
    """A collecting sink: `records` is what it has committed so far."""

    sink_id: str
    path: Path

    @property
    def records(self) -> list[Any]:
        """Every committed record (each sink subtask's in commit order, subtask after subtask)."""
        return files.committed_records({"path": str(self.path)})


def collect(
    stream: Stream, id: str, *, path: str | Path | None = None, parallelism: int | None = None
) -> Collected:
    """Write `stream` to an exactly-once sink whose committed records `Collected.records` reads: into
    `path` (a new temporary directory when None; pytest's `tmp_path` keeps tests apart)."""
    directory = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix=f"nopstream-{id}-"))
    stream.sink(id, "file", config={"path": str(directory), "format": "jsonl"}, parallelism=parallelism)
    return Collected(id, directory)
