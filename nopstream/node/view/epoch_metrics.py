"""Prometheus metrics of the epoch coordinator, read from it when scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from nopstream.checkpoint.epochs import EpochCoordinator


class CoordinatorCollector(Collector):
    """Epochs triggered, durable, committed and aborted; checkpoint durations; recoveries."""

    def __init__(self, coordinator: EpochCoordinator, *, recoveries: int) -> None:
        """Collect from one run's coordinator; `recoveries` is how many global recoveries preceded it."""
        self.coordinator = coordinator
        self.recoveries = recoveries

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The coordinator's families."""
        c = self.coordinator
        for name, doc, value in (
            ("latest_triggered_epoch", "the latest epoch triggered", c.next_epoch - 1),
            ("latest_durable_epoch", "the latest durable epoch", c.latest_durable or 0),
            ("latest_committed_epoch", "the latest committed epoch", c.latest_committed or 0),
            ("checkpoint_duration_ms", "duration of the latest durable epoch (ms)", c.last_duration_ms),
            (
                "latest_durable_timestamp_seconds",
                "when the latest durable epoch was made (before this run made one: when the run began)",
                c.latest_durable_at,
            ),
            ("checkpoint_interval_seconds", "the job's checkpoint interval", c.settings.interval_ms / 1000),
        ):
            yield GaugeMetricFamily(f"nopstream_{name}", doc, value=value)
        for name, doc, value in (
            ("durable_epochs", "epochs made durable in this run", c.durable_count),
            ("aborted_epochs", "epochs aborted in this run", c.aborted_count),
            ("recoveries", "global recoveries of this job since the command started", self.recoveries),
        ):
            yield CounterMetricFamily(f"nopstream_{name}", doc, value=value)
