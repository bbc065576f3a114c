"""Which parts of a model make its results depend on timing (docs/time.md)."""

from __future__ import annotations

from nopstream.model.load import load_data
from nopstream.plan.timing import timing_dependence


def model(**parts):
    events = {"timestampField": "ts", "maxOutOfOrdernessMs": 100}
    source = {"id": "src", "type": "file", "config": {"path": "in/*.jsonl", "format": "jsonl"}}
    window = {"kind": "tumbling", "time": "event", "sizeMs": 1000}
    return load_data(
        {
            "jobId": "t",
            "model": {
                "sources": [{**source, "watermark": {**events, **parts.get("watermark", {})}}],
                "operators": [
                    {
                        "id": "w",
                        "type": "window",
                        "key": {"field": "k"},
                        "aggregate": "count",
                        "window": {**window, **parts.get("window", {})},
                    }
                ],
                "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
            },
        }
    ).model


def test_an_event_time_job_without_idleness_or_lateness_depends_on_its_data_only():
    assert timing_dependence(model()) == []


def test_each_part_that_follows_the_wall_clock_is_named_with_its_field_path():
    assert timing_dependence(model(watermark={"idleTimeoutMs": 500}, window={"allowedLatenessMs": 10})) == [
        "model.sources[0].watermark.idleTimeoutMs: a split idle by the wall clock stops holding event time",
        "model.operators[0].window.allowedLatenessMs: updates for late records depend on the order splits"
        " arrive in",
    ]
    assert timing_dependence(model(window={"time": "processing"})) == [
        "model.operators[0].window.time: processing time follows the wall clock"
    ]
