"""Prometheus metrics of tasks, read from their counters when scraped (never per record).

`TaskCollector` turns a task's counters into metric families at scrape time, so the
record loop only bumps plain integers. `exposition(registry)` renders the text format
a `/metrics` route serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector


class TaskView(Protocol):
    """What the collector reads from a task."""

    task_id: str

    def metric_values(self) -> dict[str, float]:
        """Current values: records_in, records_out, barriers, watermark, alignment_ms, snapshot_bytes,
        pending_transactions, fenced_attempts, refused_commands."""
        ...


class TaskCollector(Collector):
    """Metric families of the tasks of one process."""

    def __init__(self, tasks: Callable[[], list[TaskView]], *, semantic_mode: str) -> None:
        """Collect from `tasks()` at every scrape."""
        self.tasks = tasks
        self.semantic_mode = semantic_mode

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | InfoMetricFamily]:
        """One family per metric, one sample per task."""
        counters = {
            "records_in": "records taken in by the task",
            "records_out": "records emitted by the task",
            "barriers": "barriers the task snapshotted and forwarded",
            "fenced_attempts": "channels refused because they came from another run",
            "refused_commands": "coordinator commands refused (another run, or a deposed coordinator)",
        }
        gauges = {
            "watermark": "the task's current event time (ms)",
            "alignment_ms": "duration of the last barrier alignment (ms)",
            "snapshot_bytes": "bytes of the last snapshot's segments",
            "pending_transactions": "sink transactions pre-committed and not yet committed",
        }
        values = [(t.task_id, t.metric_values()) for t in self.tasks()]
        for name, doc in counters.items():
            family = CounterMetricFamily(f"nopstream_task_{name}", doc, labels=["task"])
            for task_id, v in values:
                family.add_metric([task_id], v.get(name, 0.0))
            yield family
        for name, doc in gauges.items():
            gauge = GaugeMetricFamily(f"nopstream_task_{name}", doc, labels=["task"])
            for task_id, v in values:
                gauge.add_metric([task_id], v.get(name, 0.0))
            yield gauge
        info = InfoMetricFamily("nopstream_job", "the job's semantic mode")
        info.add_metric([], {"semantic_mode": self.semantic_mode})
        yield info


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format of a registry."""
    data: bytes = generate_latest(registry)
    return data
