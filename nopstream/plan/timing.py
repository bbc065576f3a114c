"""What makes a job's results depend on timing: the parts of a model docs/time.md lists.

Everything else a job computes depends on its data only (per-split watermarks and
marks), so two runs give the same committed output; `nopstream chaos` uses this list to
say why two runs of a job may differ without any fault.
"""

from __future__ import annotations

from nopstream.model.spec import StreamModel


def timing_dependence(model: StreamModel) -> list[str]:
    """The model's parts whose results depend on timing, each as `field path: why`; empty when none."""
    out: list[str] = []
    for i, source in enumerate(model.graph.sources):
        where = f"model.sources[{i}]"
        if source.watermark is not None and source.watermark.idle_timeout_ms is not None:
            out.append(
                f"{where}.watermark.idleTimeoutMs: a split idle by the wall clock stops holding event time"
            )
        if source.watermark is not None and source.config.get("discoveryIntervalMs") is not None:
            out.append(f"{where}.config.discoveryIntervalMs: splits found while the job runs may come late")
    for i, op in enumerate(model.graph.operators):
        where = f"model.operators[{i}]"
        for part, spec in (("window", op.window), ("pattern", op.pattern)):
            if spec is not None and spec.time == "processing":
                out.append(f"{where}.{part}.time: processing time follows the wall clock")
        if op.state_ttl_ms is not None and op.state_ttl_time == "processing":
            out.append(f"{where}.stateTtlTime: processing-time state expiry follows the wall clock")
        if op.window is not None and op.window.time == "event" and op.window.allowed_lateness_ms > 0:
            out.append(
                f"{where}.window.allowedLatenessMs: updates for late records depend on the order splits"
                " arrive in"
            )
    return out
