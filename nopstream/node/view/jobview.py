"""What a job's dashboard and `nopstream status` show: its history, and the view GET /api/v1/job serves.

`JobHistory` lives as long as the process that coordinates the job (the command of
`nopstream run`, a coordinator pod): its runs with their cause, its epochs with their
timings, the last task failures with their traceback, the latest stats of every task,
and a sample per vertex every second over the last five minutes. `job_view` renders
it with the plan as one JSON document (docs/dashboard.md describes every field).

Backpressure is Flink's: the share of a task's time spent waiting for credit to send,
per vertex the most backpressured subtask's, OK up to 10 %, LOW up to 50 %, HIGH above.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from nopstream.plan.epochs import EpochKind
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.runtime.metrics import TaskStats

EPOCHS_KEPT = 100
FAILURES_KEPT = 10
SAMPLE_SECONDS = 1.0
SAMPLES_KEPT = 300
LOW, HIGH = 0.10, 0.50
API_VERSION = 1
DASHBOARD_FILES = Path(__file__).parent / "dashboard"
"""The dashboard's page, its script and its vendored libraries."""


def wall_ms() -> int:
    """Milliseconds since the epoch, as every time in the view is given."""
    return int(time.time() * 1000)


def backpressure_level(ratio: float) -> str:
    """Flink's level of a backpressure ratio: ok, low or high."""
    return "ok" if ratio <= LOW else "low" if ratio <= HIGH else "high"


@dataclass(frozen=True)
class EpochRow:
    """One epoch as the coordinator saw it; times in ms."""

    epoch: int
    kind: str
    run: int
    state: str  # in-flight, durable, committed or aborted
    triggered_at: int
    duration_ms: int | None = None  # trigger to durable (end to end)
    alignment_ms: float | None = None  # the longest alignment of any task
    bytes: int = 0
    slowest_task: str | None = None  # the task whose ACK came last
    reason: str | None = None  # why it was aborted


@dataclass(frozen=True)
class RunRow:
    """One run of the job: when it began, what it restored and why it began."""

    run: int
    started_at: int
    restored_epoch: int | None
    cause: str


@dataclass(frozen=True)
class Failure:
    """A task's failure as it reported it."""

    at: int
    run: int
    task_id: str
    error: str


@dataclass(frozen=True)
class TaskRates:
    """A task's rates between its last two stats: records per second and shares of its time (0 until two)."""

    records_in_per_second: float = 0.0
    records_out_per_second: float = 0.0
    idle: float = 0.0
    backpressured: float = 0.0
    measured: bool = False

    @property
    def busy(self) -> float:
        """The share of time neither idle nor backpressured."""
        return max(0.0, 1.0 - self.idle - self.backpressured) if self.measured else 0.0


@dataclass(frozen=True)
class VertexSample:
    """A vertex's figures at one moment: summed rates, the worst subtask's shares, the lowest watermark."""

    at: int
    records_in_per_second: float
    records_out_per_second: float
    backpressured: float
    busy: float
    watermark: int | None


@dataclass
class _TaskState:
    run: int
    stats: TaskStats
    rates: TaskRates


class JobHistory:
    """Everything the view shows that the plan does not: bounded, kept across runs."""

    def __init__(self, plan: PartitionedPlan, *, clock: Callable[[], int] = wall_ms) -> None:
        """An empty history of `plan`'s job."""
        self.plan = plan
        self.clock = clock
        self.runs: list[RunRow] = []
        self.epochs: deque[EpochRow] = deque(maxlen=EPOCHS_KEPT)
        self.failures: deque[Failure] = deque(maxlen=FAILURES_KEPT)
        self.samples: dict[str, deque[VertexSample]] = {
            v.vertex_id: deque(maxlen=SAMPLES_KEPT) for v in plan.vertices
        }
        self.tasks: dict[str, _TaskState] = {}
        self.leader: dict[str, Any] = {}
        self._sampled_at = 0

    def run_started(self, run: int, restored_epoch: int | None, cause: str) -> None:
        """A run began (its cause: "start", or what ended the run before)."""
        self.runs.append(RunRow(run, self.clock(), restored_epoch, cause))

    def led(self, run: int, token: int, holder: str) -> None:
        """`holder` leads `run` with fencing token `token`."""
        self.leader = {"run": run, "token": token, "holder": holder}

    def epoch_started(self, epoch: int, kind: EpochKind, run: int) -> None:
        """`epoch` was triggered in `run`: its row, in flight, replaces an earlier row of the same epoch."""
        row = EpochRow(epoch, str(kind), run, "in-flight", self.clock())
        for i, old in enumerate(self.epochs):
            if old.epoch == epoch:
                self.epochs[i] = row
                return
        self.epochs.append(row)

    def epoch_ended(self, epoch: int, **changes: Any) -> None:
        """Change the row of `epoch` (state, duration, ...), if it is still kept."""
        for i, old in enumerate(self.epochs):
            if old.epoch == epoch:
                self.epochs[i] = replace(old, **changes)
                return

    def failed(self, run: int, task_id: str, error: str) -> None:
        """A task of `run` reported its failure."""
        self.failures.append(Failure(self.clock(), run, task_id, error))

    def stats(self, task_id: str, run: int, stats: TaskStats) -> None:
        """A task's latest stats; its rates against its previous ones of the same run."""
        before = self.tasks.get(task_id)
        rates = TaskRates()
        if before is not None and before.run == run and stats.uptime_ms > before.stats.uptime_ms:
            elapsed = (stats.uptime_ms - before.stats.uptime_ms) / 1000
            rates = TaskRates(
                (stats.records_in - before.stats.records_in) / elapsed,
                (stats.records_out - before.stats.records_out) / elapsed,
                min(1.0, (stats.idle_ms - before.stats.idle_ms) / 1000 / elapsed),
                min(1.0, (stats.backpressured_ms - before.stats.backpressured_ms) / 1000 / elapsed),
                measured=True,
            )
        elif before is not None and before.run == run:
            rates = before.rates  # the same stats again (a task's last report)
        self.tasks[task_id] = _TaskState(run, stats, rates)
        now = self.clock()
        if now - self._sampled_at >= SAMPLE_SECONDS * 1000:
            self._sampled_at = now
            for vertex_id, sample in self.vertex_samples(now).items():
                self.samples[vertex_id].append(sample)

    def vertex_samples(self, now: int) -> dict[str, VertexSample]:
        """Each vertex's figures from its subtasks' latest rates."""
        samples = {}
        for v in self.plan.vertices:
            states = [self.tasks[s.task_id] for s in v.subtasks if s.task_id in self.tasks]
            marks = [t.stats.watermark for t in states if t.stats.watermark is not None]
            samples[v.vertex_id] = VertexSample(
                now,
                round(sum(t.rates.records_in_per_second for t in states), 1),
                round(sum(t.rates.records_out_per_second for t in states), 1),
                round(max((t.rates.backpressured for t in states), default=0.0), 3),
                round(max((t.rates.busy for t in states), default=0.0), 3),
                min(marks) if len(marks) == len(v.subtasks) and marks else None,
            )
        return samples


def job_view(
    history: JobHistory,
    *,
    latest_durable: int | None,
    latest_committed: int | None,
    state: str,
) -> dict[str, Any]:
    """The document of GET /api/v1/job (docs/dashboard.md)."""
    plan, now = history.plan, history.clock()
    ident = plan.identity
    vertices = _vertex_rows(history, now)
    edges = [
        {"id": e.edge_id, "source": e.source_vertex, "target": e.target_vertex, "policy": e.policy.value}
        for e in plan.edges
    ]
    tasks = [_task_row(history, v.vertex_id, s.task_id) for v in plan.vertices for s in v.subtasks]
    return {
        "apiVersion": API_VERSION,
        "now": now,
        "job": {
            "jobId": ident.job_id,
            "pipelineId": ident.pipeline_id,
            "planVersion": ident.plan_version,
            "semanticMode": ident.semantic_mode.value,
            "state": state,
        },
        "leader": history.leader or None,
        "graph": {"vertices": vertices, "edges": edges},
        "tasks": tasks,
        "series": {
            vertex_id: [_camel(asdict(s)) for s in samples] for vertex_id, samples in history.samples.items()
        },
        "checkpoints": {
            "latestDurable": latest_durable,
            "latestCommitted": latest_committed,
            "history": [_camel(asdict(r)) for r in reversed(history.epochs)],
        },
        "runs": [_camel(asdict(r)) for r in reversed(history.runs)],
        "failures": [_camel(asdict(f)) for f in reversed(history.failures)],
    }


def _vertex_rows(history: JobHistory, now: int) -> list[dict[str, Any]]:
    """Each vertex of the graph with its rates, backpressure and watermark now."""
    current = history.vertex_samples(now)
    rows = []
    for v in history.plan.vertices:
        sample = current[v.vertex_id]
        rows.append(
            {
                "id": v.vertex_id,
                "parallelism": v.parallelism,
                "operators": [{"id": n.node_id, "kind": n.kind, "type": n.type} for n in v.operators],
                "recordsInPerSecond": sample.records_in_per_second,
                "recordsOutPerSecond": sample.records_out_per_second,
                "backpressured": sample.backpressured,
                "busy": sample.busy,
                "level": backpressure_level(sample.backpressured),
                "watermark": sample.watermark,
                "watermarkLagMs": now - sample.watermark if sample.watermark is not None else None,
            }
        )
    return rows


def _task_row(history: JobHistory, vertex_id: str, task_id: str) -> dict[str, Any]:
    """A task's latest report (`reported` false before its first)."""
    t = history.tasks.get(task_id)
    if t is None:
        return {"id": task_id, "vertex": vertex_id, "reported": False}
    return {
        "id": task_id,
        "vertex": vertex_id,
        "reported": True,
        "run": t.run,
        "recordsIn": t.stats.records_in,
        "recordsOut": t.stats.records_out,
        "deadLetters": t.stats.dead_letters,
        "lookups": t.stats.lookups,
        "watermark": t.stats.watermark,
        "idle": round(t.rates.idle, 3),
        "backpressured": round(t.rates.backpressured, 3),
        "busy": round(t.rates.busy, 3),
    }


def _camel(row: dict[str, Any]) -> dict[str, Any]:
    """A row's snake_case names as the API's camelCase."""
    return {_camel_name(k): v for k, v in row.items()}


def _camel_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def render_view(view: dict[str, Any]) -> list[str]:
    """The view as `nopstream status` prints it: the job, its vertices, recent epochs, runs, failures."""
    job, leader, cps = view["job"], view["leader"], view["checkpoints"]
    led = f", run {leader['run']} led with token {leader['token']}" if leader else ", no run led yet"
    lines = [
        f"job '{job['jobId']}' {job['state']} ({job['semanticMode']}){led}",
        f"  latest durable epoch {_shown(cps['latestDurable'])}, committed {_shown(cps['latestCommitted'])}",
    ]
    for v in view["graph"]["vertices"]:
        lines.append(
            f"  {v['id']} x{v['parallelism']}: in {v['recordsInPerSecond']:,.0f}/s,"
            f" out {v['recordsOutPerSecond']:,.0f}/s, busy {v['busy']:.0%},"
            f" backpressured {v['backpressured']:.0%} ({v['level'].upper()})"
            + (f", watermark {v['watermark']}" if v["watermark"] is not None else "")
        )
    for e in cps["history"][:5]:
        took = f" in {e['durationMs']} ms" if e["durationMs"] is not None else ""
        why = f" ({e['reason']})" if e["reason"] else ""
        lines.append(f"  epoch {e['epoch']} {e['kind']} {e['state']}{took}{why}, {e['bytes']:,} bytes")
    for r in view["runs"][:5]:
        lines.append(f"  run {r['run']} from epoch {_shown(r['restoredEpoch'])}: {r['cause']}")
    for f in view["failures"][:3]:
        first = f["error"].strip().splitlines()[-1] if f["error"].strip() else ""
        lines.append(f"  failure in run {f['run']}, {f['taskId']}: {first}")
    return lines


def _shown(value: object) -> str:
    return "none" if value is None else str(value)
