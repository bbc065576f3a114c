"""A checkpoint written by the code before issue 34 restores, its pending sink transactions published.

`tests/data/checkpoint-c5d40fa` was written by commit c5d40fa (main before the records
that cross processes were typed): `nopstream run job.yaml --workdir work` of its job
with `NOPSTREAM_SOURCE_PAUSE_MS=100 NOPSTREAM_BATCH_SIZE=50
NOPSTREAM_FAULTS=coordinator-after-durable@4`, so the runner died between epoch 4's
DURABLE and its commit: the checkpoint holds keyed sums, file cursors and each sink
subtask's pending transaction of epoch 4, whose file is still staged.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

from tests.conftest import ROOT, after_dashboard_line, run_nopstream

OLD = ROOT / "tests" / "data" / "checkpoint-c5d40fa"


def _output(home: Path) -> Counter[str]:
    return Counter(
        json.dumps(json.loads(line), sort_keys=True)
        for path in sorted((home / "out").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    )


def test_a_checkpoint_of_the_old_layout_resumes_with_its_pending_transactions_and_exact_output(tmp_path):
    resumed, fresh = tmp_path / "resumed", tmp_path / "fresh"
    shutil.copytree(OLD, resumed)
    pending = sorted(
        p.name for p in (resumed / "checkpoints").glob("checkpoint/oldlayout/main/4/out/*/sink/*")
    )
    assert pending == ["oldlayout:main:out:0:4", "oldlayout:main:out:1:4"]  # what the restore must publish
    assert len(list((resumed / "out" / ".staging").glob("*.0000000004.jsonl"))) == 2

    done = run_nopstream("run", "job.yaml", "--workdir", "work", cwd=resumed)
    assert done.code == 0, done.err
    assert after_dashboard_line(done.err).splitlines()[0] == "job 'oldlayout': resuming from epoch 4"

    fresh.mkdir()
    shutil.copy(OLD / "job.yaml", fresh)
    shutil.copytree(OLD / "in", fresh / "in")
    again = run_nopstream("run", "job.yaml", "--workdir", "work", "--quiet", cwd=fresh)
    assert again.code == 0, again.err
    expected = _output(fresh)
    assert sum(expected.values()) == 800  # a rolling sum per order
    assert _output(resumed) == expected
