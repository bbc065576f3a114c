"""A record the job cannot take fails the run at once, in one line naming the split, the byte and the rule.

Found by an adversary: invalid UTF-8 in a text file, a line that is not JSON, nesting
deeper than the parser allows, and a record over the channel's 256 MiB limit each
gave ten recoveries and a traceback naming neither the file nor the offset. Each is
deterministic: no run can take it, so none is retried (`BadInput`), in task processes
and in one process alike.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_nopstream


def job(tmp_path, content: bytes, *, fmt: str, extra: list | None = None) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(content)
    model = {
        "jobId": "bad",
        "checkpoint": {"storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [{"id": "lines", "type": "file", "config": {"path": "in/*.txt", "format": fmt}}],
            "operators": extra or [],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(model, sort_keys=False))


GOOD = b'{"n": 1}\n' * 1000  # 9,000 bytes before the bad line


@pytest.mark.parametrize("mode", [[], ["--in-process"]], ids=["processes", "in-process"])
@pytest.mark.parametrize(
    ("content", "fmt", "why"),
    [
        (
            GOOD + b"not json\n",
            "jsonl",
            "is not JSON (invalid literal, expected 'null': line 1 column 1 (char 0))",
        ),
        (
            GOOD + b"[" * 2000 + b"]" * 2000 + b"\n",
            "jsonl",
            "is not JSON (depth limit exceeded: line 1 column 1026 (char 1025))",
        ),
        (
            b"ok\n" * 3000 + b"caf\xe9\n",
            "text",
            "is not UTF-8 (invalid continuation byte at byte 3 of the line)",
        ),
    ],
    ids=["not-json", "too-deep", "not-utf8"],
)
def test_a_bad_line_fails_the_run_naming_its_split_and_byte_without_a_retry(
    tmp_path, content, fmt, why, mode
):
    job(tmp_path, content, fmt=fmt)
    result = run_nopstream("run", "job.yaml", "--quiet", *mode, cwd=tmp_path)
    assert result.code == 3, result.err
    offset = 9000
    line = f"split 'in/a.txt#0' of 'in/a.txt': the line at byte {offset} {why}"
    assert line in result.err, result.err
    assert "recovering:" not in result.err
    assert "Traceback" not in result.err
    assert not list((tmp_path / "out").glob("*.jsonl"))


def test_a_record_over_the_channel_limit_fails_the_run_without_a_retry(tmp_path):
    fns = "def huge(line):\n    return 'x' * (257 << 20)\n"
    (tmp_path / "bigfns.py").write_text(fns)
    job(
        tmp_path,
        b"a\n",
        fmt="text",
        extra=[{"id": "big", "type": "map", "fn": "bigfns:huge", "parallelism": 1}],
    )
    model = yaml.safe_load((tmp_path / "job.yaml").read_text())
    model["model"]["sinks"][0]["parallelism"] = 2  # a channel between the map and the sink
    model["model"]["sinks"][0]["partitioning"] = "rebalance"
    (tmp_path / "job.yaml").write_text(json.dumps(model))
    result = run_nopstream("run", "job.yaml", "--quiet", cwd=tmp_path, timeout=300)
    assert result.code == 3, result.err
    assert (
        "a record encodes to 269,484,0" in result.err
        and "over the 268,435,456 bytes a record may take" in result.err
    )
    assert "recovering:" not in result.err
