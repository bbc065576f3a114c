"""What a task reports of itself: Prometheus metrics and the stats it sends its coordinator.

`TaskCollector` turns a task's counters into metric families at scrape time, so the
record loop only bumps plain integers. `exposition(registry)` renders the text format
a `/metrics` route serves. `TaskStats` is the record a task process sends its
coordinator twice a second (records, watermark, and where its time went: idle waiting
for input, backpressured waiting for credit, busy otherwise), for the progress line,
the dashboard and the run's result.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

T = TypeVar("T")


class TaskView(Protocol):
    """What the collector reads from a task."""

    task_id: str

    def metric_values(self) -> dict[str, float]:
        """Current values: records_in, records_out, barriers, watermark, alignment_ms, snapshot_bytes,
        pending_transactions, fenced_attempts, refused_commands, dead_letters."""
        ...


@dataclass(frozen=True)
class TaskStats:
    """A task's counters at one moment; the times are cumulative since the task was built."""

    records_in: int = 0
    records_out: int = 0
    watermark: int | None = None
    uptime_ms: int = 0
    idle_ms: int = 0
    backpressured_ms: int = 0
    channels: dict[str, dict[str, int]] = field(default_factory=dict)
    dead_letters: int = 0
    lookups: dict[str, float] = field(default_factory=dict)
    """A task with lookups: `hits`, `misses`, `in_flight`, `latency_ms` (`runtime.chain.Chain.lookups`)."""

    def to_json(self) -> dict[str, Any]:
        """The body of POST /stats (beside the task id and run)."""
        return {
            "recordsIn": self.records_in,
            "recordsOut": self.records_out,
            "watermark": self.watermark,
            "uptimeMs": self.uptime_ms,
            "idleMs": self.idle_ms,
            "backpressuredMs": self.backpressured_ms,
            "channels": self.channels,
            "deadLetters": self.dead_letters,
            "lookups": self.lookups,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> TaskStats:
        """Stats from a POST /stats body; ValueError naming the first field of the wrong type."""
        counts = {}
        for name in ("recordsIn", "recordsOut", "uptimeMs", "idleMs", "backpressuredMs", "deadLetters"):
            value = body.get(name, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, not {value!r}")
            counts[name] = value
        watermark, channels, lookups = (
            body.get("watermark"),
            body.get("channels", {}),
            body.get("lookups", {}),
        )
        if not isinstance(lookups, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in lookups.values()
        ):
            raise ValueError("lookups must be an object of numbers")
        if watermark is not None and (not isinstance(watermark, int) or isinstance(watermark, bool)):
            raise ValueError(f"watermark must be a whole number or null, not {watermark!r}")
        if not isinstance(channels, dict):
            raise ValueError("channels must be an object")
        return cls(
            counts["recordsIn"],
            counts["recordsOut"],
            watermark,
            counts["uptimeMs"],
            counts["idleMs"],
            counts["backpressuredMs"],
            channels,
            counts["deadLetters"],
            lookups,
        )


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
            "dead_letters": "records set aside on a dead-letter output (onError: dead-letter)",
            "lookup_hits": "lookups answered from the cache",
            "lookup_misses": "lookups that called the looked-up system",
        }
        gauges = {
            "watermark": "the task's current event time (ms)",
            "alignment_ms": "duration of the last barrier alignment (ms)",
            "snapshot_bytes": "bytes of the last snapshot's segments",
            "pending_transactions": "sink transactions pre-committed and not yet committed",
            "lookup_in_flight": "lookup calls in flight",
            "lookup_latency_ms": "mean duration of the lookup calls made (ms)",
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


@dataclass
class TaskMetrics:
    """Counters a runner shows as progress."""

    records_in: int = 0
    records_out: int = 0
    watermark: int | None = None
    barriers: int = 0
    alignment_ms: float = 0.0
    snapshot_bytes: int = 0
    refused_commands: int = 0
    idle_seconds: float = 0.0  # waiting for input, for a barrier, or polling an empty source
    idle_since: float | None = None  # when the wait going on began
    started: float = field(default_factory=time.monotonic)

    async def idle(self, waiting: Awaitable[T]) -> T:
        """Await what the task waits on (input, a barrier, an empty source's poll): its time is idle."""
        self.idle_since = time.monotonic()
        try:
            return await waiting
        finally:
            self.idle_seconds += time.monotonic() - self.idle_since
            self.idle_since = None

    def idle_now(self) -> float:
        """Seconds idle so far, a wait still going on included."""
        ongoing = time.monotonic() - self.idle_since if self.idle_since is not None else 0.0
        return self.idle_seconds + ongoing
