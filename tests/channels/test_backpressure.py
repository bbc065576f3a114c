"""Backpressure across real task processes: a slow sink bounds every channel's buffered bytes."""

from __future__ import annotations

import textwrap

from nopstream.local import runner
from nopstream.model.load import load_data
from nopstream.plan import compiler

WINDOW = 64 * 1024


def test_slow_sink_keeps_channels_under_their_credit_window(tmp_path, monkeypatch):
    (tmp_path / "slowfns.py").write_text(
        textwrap.dedent("""
        import time

        def slow(r):
            time.sleep(0.0002)
            return r
    """)
    )
    monkeypatch.setenv("NOPSTREAM_CREDIT_WINDOW", str(WINDOW))
    monkeypatch.chdir(tmp_path)
    model = {
        "jobId": "backpressure",
        "semanticMode": "AT_LEAST_ONCE",
        "model": {
            "sources": [
                {
                    "id": "fast",
                    "type": "generator",
                    "parallelism": 2,
                    "config": {"kind": "events", "count": 20_000},
                }
            ],
            "operators": [
                {"id": "slow", "type": "map", "inputs": ["fast"], "fn": "slowfns:slow", "parallelism": 1}
            ],
            "sinks": [{"id": "out", "type": "file", "inputs": ["slow"], "config": {"path": "out"}}],
        },
    }
    plans = compiler.compile_model(load_data(model), backend="local")
    result = runner.run_job(
        plans, runner.RunOptions(quiet=True, workdir=tmp_path / ".nopstream", python_path=(str(tmp_path),))
    )
    assert result.records_in["slow"] == 20_000
    lines = sum(len(f.read_text().splitlines()) for f in (tmp_path / "out").glob("*.jsonl"))
    assert lines == 20_000
    edge = [c for c in result.channels if c.startswith("fast->slow/")]
    assert len(edge) == 2
    max_frame = 80 * 1000  # a batch of 1,000 events is under 80 kB
    for channel in edge:
        stats = result.channels[channel]
        assert stats["window"] == WINDOW
        # the sender never had more than its window (plus the one frame an empty window admits) in flight,
        assert stats["maxOutstanding"] <= WINDOW + max_frame, (channel, stats)
        # nor did the receiver buffer more,
        assert stats["maxBuffered"] <= WINDOW + max_frame, (channel, stats)
        # and the window was reached: the fast source really was held back.
        assert stats["maxOutstanding"] >= WINDOW - max_frame, (channel, stats)
