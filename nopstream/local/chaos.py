"""`nopstream chaos FILE`: prove exactly-once on any job by killing it where it hurts.

It runs the job twice as `nopstream run` processes (or `nopstream run --etcd`), each
with checkpoints and sink output of its own (a copy of the job file points them into
the chaos directory, or under a prefix of their own in the sinks' buckets): once
failure-free, then again under a seeded schedule (`local.kills`) of SIGKILLs of a
task process, a coordinator candidate (with `--etcd`) or the whole runner with every
process it started (then started again, as a user would), and of fault points armed
at each protocol step the failure-free run took. The committed output of both runs is
compared as exact multisets: anything missing or doubled is printed with examples, and
the verdict is exit 1; in a job whose results depend on timing (`plan.timing`: idleness,
processing time, allowed lateness, discovery) a difference proves nothing, and chaos
says so, naming the parts, with exit 4. What the recoveries restored is read from the tasks' restore
reports; a run whose kills restored no state, or did not reach every step, proves less
than it seems and exits 1 too, unless allowed. A user function that is not
deterministic shows up as a difference.
WARNING: the job's sources are read by both runs and must not change meanwhile.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from nopstream import faults, safefiles, stacks
from nopstream.connectors import registry
from nopstream.local import kills
from nopstream.local.children import Child, spawn
from nopstream.model.load import load_data
from nopstream.node.checkpointing import RestoreReport
from nopstream.plan.timing import timing_dependence

EXAMPLES = 5  # records shown of each kind of difference
UNDECIDED = 4
"""The exit of a run whose outputs differ in a job whose results depend on timing."""
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)
RUN_ENV, FAILURE_FREE, UNDER_KILLS = "NOPSTREAM_CHAOS_RUN", "failure-free", "under-kills"
"""Which run a process serves, in its environment: a job's functions that slow it down for its kills
to land may read it and not slow the failure-free run, which only has to end."""


@dataclass(frozen=True)
class ChaosSettings:
    """What to kill, how often, and within which bounds."""

    kills: int = 10
    seed: int = 0
    etcd: str | None = None
    workdir: Path = Path(".nopstream/chaos")
    timeout: float = 600.0
    allow_shallow: bool = False
    """Exit 0 on equal outputs even when no recovery restored state or a step was not reached."""
    pace_ms: int = 0
    """Each source of the run under kills pauses this long after each batch of at most `PACED_BATCH`
    records: a job that ends within a checkpoint interval or two lasts long enough for its kills to land
    (the failure-free run only has to end: it reads at full speed)."""
    early_share: float = 0.25
    """The share of kills that land at once (`local.kills`); the others follow progress."""
    first_kill: tuple[float, float] = (0.1, 1.0)
    between_kills: tuple[float, float] = (0.2, 1.2)
    fault_wait: float = 30.0
    """Seconds an armed fault point may wait for a process to reach it."""
    python_path: tuple[str, ...] = ()
    """Where the runs import user functions from, besides the job file's directory (`Job.chaos`)."""


@dataclass
class Outcome:
    """What one run of the job did, and what its sinks committed."""

    code: int
    recoveries: int = 0
    starts: int = 1
    errors: str = ""
    records: Counter[str] = field(default_factory=Counter)
    job: dict[str, Any] = field(default_factory=dict)
    restores: dict[tuple[str, int, str], RestoreReport] = field(default_factory=dict)
    """Every task start's restore report, by (log, line number, line): read after each runner ends."""
    reached: kills.Reached = field(default_factory=kills.Reached)
    left: list[kills.Event] = field(default_factory=list)
    """Events of the schedule the job ended before."""
    passed: set[str] = field(default_factory=set)
    """The fault points the run's processes passed (`faults.passed`)."""

    def coverage(self) -> str:
        """What the task starts restored, in one line."""
        reports = list(self.restores.values())
        stateful = [r for r in reports if r.epoch is not None]
        epochs = sorted({r.epoch for r in stateful if r.epoch is not None})
        shown = ", ".join(map(str, epochs[:12])) + (", ..." if len(epochs) > 12 else "")
        return (
            f"{len(reports)} task starts, {len(stateful)} from a durable epoch"
            + (f" (epochs {shown})" if epochs else "")
            + f"; restored {sum(r.keyed_entries for r in stateful):,} keyed entries,"
            f" {sum(r.timers for r in stateful):,} timers, {sum(r.cursors for r in stateful):,} source"
            f" cursors, {sum(r.pending_transactions for r in stateful):,} pending sink transactions;"
            f" sinks re-committed {sum(r.recommitted for r in reports):,} transactions and aborted"
            f" {sum(r.aborted for r in reports):,}"
        )

    def shallow(self) -> list[str]:
        """Why the run under kills proves less than it seems: nothing restored, steps not reached."""
        why = []
        if not any(r.epoch is not None for r in self.restores.values()):
            why.append("no kill reached a durable epoch: the restore path was not exercised")
        if self.reached.missed:
            why.append(f"fault points armed and not reached: {', '.join(self.reached.missed)}")
        if self.left:
            why.append(f"the job ended before {len(self.left)} events: {', '.join(map(str, self.left))}")
        return why


class ChaosFailed(RuntimeError):
    """A run of the job could not complete (not a difference of outputs)."""


def run_chaos(job_file: Path, settings: ChaosSettings, *, out: TextIO = sys.stdout) -> int:
    """Run the job clean, then under the schedule; print the comparison and the coverage;
    0 when the outputs are equal (and the kills reached state and every step, unless allowed)."""
    raw = yaml.safe_load(job_file.read_text())
    token = uuid.uuid4().hex[:8]
    base = settings.workdir / token
    clean = _run(job_file, raw, base / "clean", f"chaos-{token}-clean", settings, planned=None)
    if clean.code != 0:
        raise ChaosFailed(f"the failure-free run failed (exit {clean.code}):\n{clean.errors.strip()}")
    rng = random.Random(settings.seed)
    events = kills.plan_events(rng, settings.kills, clean.passed | set(kills.CAUSED), settings.early_share)
    faulty = _run(job_file, raw, base / "faulty", f"chaos-{token}-faulty", settings, planned=(events, rng))
    if faulty.code != 0:
        raise ChaosFailed(f"the run under kills failed (exit {faulty.code}):\n{faulty.errors.strip()}")
    missing, doubled = clean.records - faulty.records, faulty.records - clean.records
    print(
        f"chaos: {job_file} (seed {settings.seed}{', etcd ' + settings.etcd if settings.etcd else ''})",
        file=out,
    )
    if settings.pace_ms:
        print(
            f"  paced: each source pauses {settings.pace_ms} ms after each batch of at most {PACED_BATCH}"
            " records, in the run under kills",
            file=out,
        )
    _print_reach(settings, events, faulty, out)
    total, got = sum(clean.records.values()), sum(faulty.records.values())
    print(f"  committed records: {total} failure-free, {got} under kills", file=out)
    timing = timing_dependence(load_data(raw).model)
    for why in timing:
        print(f"  depends on timing: {why}", file=out)
    names = ("only failure-free", "only under kills") if timing else ("missing", "duplicated")
    for name, diff in zip(names, (missing, doubled), strict=True):
        print(f"  {name}: {sum(diff.values())}", file=out)
        for record, n in sorted(diff.items())[:EXAMPLES]:
            print(f"    {record}" + (f" (x{n})" if n > 1 else ""), file=out)
    exact = not missing and not doubled
    if timing and not exact:
        print(
            "  verdict: cannot tell: two runs of this job may differ without any fault (docs/time.md)",
            file=out,
        )
        return UNDECIDED
    print(f"  verdict: {'exactly once' if exact else 'NOT exactly once'}", file=out)
    shallow = faulty.shallow()
    for why in shallow:
        allowed = (
            " (allowed)"
            if settings.allow_shallow
            else " (give the job more input or --pace, or --allow-shallow)"
        )
        print(f"  shallow: {why}{allowed}", file=out)
    if exact:  # outputs in files stay in the work directory; tables and topics would pile up
        drop_outputs(clean.job)
        drop_outputs(faulty.job)
    return 0 if exact and (settings.allow_shallow or not shallow) else 1


def _print_reach(settings: ChaosSettings, events: list[kills.Event], faulty: Outcome, out: TextIO) -> None:
    """What the schedule asked for and what the run under kills reached."""
    early = sum(e.early for e in events)
    points = [e.point for e in events if e.point]
    print(
        f"  schedule: {settings.kills} kills ({early} at once, the others after a new durable epoch)"
        f" and {len(points)} fault points, in this order: {', '.join(map(str, events))}",
        file=out,
    )
    reached = faulty.reached
    done = sum(reached.kills.values())
    shown = ", ".join(f"{n} {what}" for what, n in sorted(reached.kills.items())) or "none"
    print(f"  SIGKILLs: {done} ({shown})", file=out)
    if reached.deferred:
        moved = ", ".join(reached.deferred)
        print(f"  moved to the end (not reached while the input was held): {moved}", file=out)
    print(
        f"  fault points hit: {len(reached.hit)} of {len(points)}"
        + (f" ({', '.join(sorted(reached.hit))})" if reached.hit else ""),
        file=out,
    )
    print(f"  global recoveries: {faulty.recoveries}; runner starts: {faulty.starts}", file=out)
    print(f"  restores: {faulty.coverage()}", file=out)


def _run(
    job_file: Path,
    raw: dict[str, Any],
    home: Path,
    tag: str,
    settings: ChaosSettings,
    *,
    planned: tuple[list[kills.Event], random.Random] | None,
) -> Outcome:
    """One run of the job with its own checkpoints and outputs, carrying out the `planned` events with
    the generator that planned them (None: failure-free), started again after each whole-runner kill."""
    job, path, fault_dir = _prepared(raw, home, tag)
    env = _env(job_file, fault_dir, settings, under_kills=planned is not None)
    progress = kills.Progress(job)
    deadline = time.monotonic() + settings.timeout

    def savepoint() -> bool:
        return _savepoint(path, home, settings, env)

    schedule = None
    if planned is None:  # held at the end of its input until its savepoint (`kills.take_savepoint`)
        faults.hold(fault_dir, held=True)
    else:
        schedule = kills.Schedule(
            *planned,
            progress,
            fault_dir,
            first_kill=settings.first_kill,
            between_kills=settings.between_kills,
            fault_wait=settings.fault_wait,
            savepoint=savepoint,
            deadline=deadline,
        )
    outcome = Outcome(code=-1)
    while True:
        proc = _start(path, home, settings, env)
        try:
            if schedule is not None:
                schedule.drive(proc)
            else:
                kills.take_savepoint(proc, progress, fault_dir, savepoint, deadline)
            late = f"{tag}: the job did not finish within {settings.timeout:.0f}s"
            code = _wait_to_end(proc, home, late, deadline)
        finally:
            if proc.poll() is None:  # timed out, or chaos itself was interrupted: leave nothing behind
                proc.kill()
                _wait_group_gone(proc)
            _read_restores(home, outcome)  # before a new runner writes its run-1 logs again
        if code == -signal.SIGKILL:  # the whole runner was killed: start it again, as a user would
            _wait_group_gone(proc)
            outcome.starts += 1
            continue
        outcome.code = code
        break
    if schedule is not None:
        schedule.finish()
        outcome.reached, outcome.left = schedule.reached, list(schedule.events)
    return _ended(outcome, job, home, fault_dir)


def _prepared(raw: dict[str, Any], home: Path, tag: str) -> tuple[dict[str, Any], Path, Path]:
    """The job isolated into `home` (`tag` its names), its outputs made: the job, its file and the folder
    of its fault points."""
    safefiles.trusted_dir(home, what="the chaos work directory")
    job = _isolated(raw, home, tag)
    _create_outputs(raw, job)
    path = home / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    fault_dir = home / "faults"
    fault_dir.mkdir()
    return job, path, fault_dir


def _ended(outcome: Outcome, job: dict[str, Any], home: Path, fault_dir: Path) -> Outcome:
    """The outcome with what the run left: the steps it passed, its messages and, when it completed,
    its committed records (a failed run is not compared)."""
    outcome.passed = faults.passed(fault_dir)
    outcome.errors = (home / "runner.log").read_text(errors="replace")
    outcome.recoveries = outcome.errors.count("recovering: ")
    if outcome.code == 0:
        outcome.records = committed(job)
    outcome.job = job
    return outcome


def _read_restores(home: Path, outcome: Outcome) -> None:
    """Add the restore reports in the run's task logs (`node.checkpointing.RestoreReport`)."""
    for log in sorted((home / "work" / "runs").glob("*/*/logs/*.log")):
        for i, line in enumerate(log.read_text(errors="replace").splitlines()):
            report = RestoreReport.from_line(line)
            if report is not None:
                outcome.restores[(str(log), i, line)] = report


PACED_BATCH = 100


def _env(job_file: Path, fault_dir: Path, settings: ChaosSettings, *, under_kills: bool) -> dict[str, str]:
    """The environment of a run: the job's directory (and the settings' path) importable, fault points
    armed from `fault_dir`, which run it is (RUN_ENV), and the sources of the run under kills paced
    when asked (`node.settings`)."""
    python_path = [
        str(job_file.resolve().parent),
        *settings.python_path,
        _PACKAGE_ROOT,
        os.environ.get("PYTHONPATH", ""),
    ]
    paced = (
        {"NOPSTREAM_SOURCE_PAUSE_MS": str(settings.pace_ms), "NOPSTREAM_BATCH_SIZE": str(PACED_BATCH)}
        if settings.pace_ms and under_kills
        else {}
    )
    return {
        **os.environ,
        **paced,
        "PYTHONPATH": os.pathsep.join(p for p in python_path if p),
        faults.DIR_ENV: str(fault_dir.resolve()),
        RUN_ENV: UNDER_KILLS if under_kills else FAILURE_FREE,
    }


def _command(settings: ChaosSettings, *args: str) -> list[str]:
    """A `nopstream` command line, with `--etcd` when the runs use etcd."""
    extra = ["--etcd", settings.etcd] if settings.etcd else []
    return [sys.executable, "-m", "nopstream", *args, *extra]


def _start(path: Path, home: Path, settings: ChaosSettings, env: dict[str, str]) -> Child:
    """`nopstream run` of the isolated job file, in a session of its own (so all of it can be killed),
    what it says in runner.log."""
    # its kills are deliberate: no failure budget, and no backoff (it would only slow the proof down)
    options = ("--max-restarts", "1000", "--restart-backoff", "0", "--workdir", str(home / "work"))
    command = _command(settings, "run", str(path), *options)
    return spawn("runner", command, log=home / "runner.log", env=env, session=True)


def _savepoint(path: Path, home: Path, settings: ChaosSettings, env: dict[str, str]) -> bool:
    """`nopstream savepoint` of the running job, as a user asks for one; whether its coordinator took it."""
    command = _command(settings, "savepoint", str(path), "--workdir", str(home / "work"))
    try:
        done = subprocess.run(command, env=env, capture_output=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _wait_to_end(proc: Child, home: Path, late: str, deadline: float) -> int:
    """The runner's exit code once it ends; ChaosFailed saying `late`, the last recovery and where each
    process waits if it is still running at `deadline`."""
    code = proc.wait(max(1.0, deadline - time.monotonic()))
    if code is not None:
        return code
    waits = _where_it_waits(proc)
    said = (home / "runner.log").read_text(errors="replace").splitlines()
    # a run that fails again and again is caught between runs as often as not: the last failure says why
    last = next((line for line in reversed(said) if line.startswith("recovering: ")), None)
    recovered = f"; its last {last[:400]}" if last else ""
    raise ChaosFailed(f"{late}{recovered}; where its processes wait:\n{waits}")


def _where_it_waits(proc: Child, settle: float = 1.0, lines: int = 12) -> str:
    """Each live process of the run: its last log line and where it waits (`nopstream.stacks`)."""
    pids = [proc.pid, *kills.children(proc.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    time.sleep(settle)  # each writes its dump to its log
    found = []
    for pid in pids:
        try:
            log = Path(os.readlink(f"/proc/{pid}/fd/2"))
            text = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        mark = f"{stacks.MARK} {pid} waits:"
        at = max((i for i, line in enumerate(text) if line == mark), default=len(text))
        said = next((line for line in reversed(text[:at]) if not line.startswith("  ")), "(nothing)")
        dump = [line for line in text[at + 1 : at + 1 + lines] if line.startswith("  ")]
        found.append(f"{log.name} (pid {pid}), last said: {said[-160:]}")
        found.extend(f"  {line.strip()[:200]}" for line in dump)
    return "\n".join(found)


def _wait_group_gone(proc: Child, timeout: float = 30.0) -> None:
    """Wait until no process of the killed runner's session is left (they hold its lock)."""
    deadline = time.monotonic() + timeout
    proc.wait(timeout)
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise ChaosFailed(f"processes of the killed runner {proc.pid} are still alive after {timeout:.0f}s")


def _isolated(raw: dict[str, Any], home: Path, tag: str) -> dict[str, Any]:
    """A copy of the job whose checkpoints, sink outputs and source positions kept at their origin
    (a replication slot) are its own (under `home`, or named with `tag`)."""
    job = copy.deepcopy(raw)
    checkpoint = _spec(job).setdefault("checkpoint", {})
    storage = checkpoint.get("storage") or {}
    if "s3" in storage:
        storage["s3"]["prefix"] = f"{storage['s3'].get('prefix', '')}{tag}/"
    else:
        storage = {"local": {"path": str((home / "checkpoints").resolve())}}
    checkpoint["storage"] = storage
    for sink in _sinks(job):
        kind = registry.sink_kind(sink.get("type", ""))
        sink["config"] = kind.isolated(sink.get("config", {}), home / "out" / sink["id"], tag)
    for source in _sources(job):
        source["config"] = registry.source_kind(source.get("type", "")).isolated(
            source.get("config", {}), tag
        )
    return job


def _create_outputs(raw: dict[str, Any], job: dict[str, Any]) -> None:
    """Each sink's output of this run that must exist before it (a table, a topic), empty, made like the
    sink's own; each source position of its own, where the source's own is (every run reads the same)."""
    for original, isolated in zip(_sinks(raw), _sinks(job), strict=True):
        create = registry.sink_kind(original.get("type", "")).create_like
        if create is not None:
            create(original.get("config", {}), isolated["config"])
    for original, isolated in zip(_sources(raw), _sources(job), strict=True):
        copy = registry.source_kind(original.get("type", "")).create_like
        if copy is not None:
            copy(original.get("config", {}), isolated["config"])


def drop_outputs(job: dict[str, Any]) -> None:
    """Drop the run's outputs and source positions that would pile up (tables, topics, slots) once its
    output compared equal."""
    for sink in _sinks(job):
        drop = registry.sink_kind(sink.get("type", "")).drop
        if drop is not None:
            drop(sink["config"])
    for source in _sources(job):
        forget = registry.source_kind(source.get("type", "")).drop
        if forget is not None:
            forget(source["config"])


def _spec(job: dict[str, Any]) -> dict[str, Any]:
    """The spec of a StreamJob manifest, or a bare model itself."""
    spec: dict[str, Any] = job["spec"] if "kind" in job or "apiVersion" in job else job
    return spec


def _sinks(job: dict[str, Any]) -> list[dict[str, Any]]:
    sinks: list[dict[str, Any]] = _spec(job).get("model", {}).get("sinks", [])
    return sinks


def _sources(job: dict[str, Any]) -> list[dict[str, Any]]:
    sources: list[dict[str, Any]] = _spec(job).get("model", {}).get("sources", [])
    return sources


def committed(job: dict[str, Any]) -> Counter[str]:
    """Every record the job's committing sinks committed, as a multiset (strings as is, others as JSON);
    ChaosFailed naming the sink when one cannot be read (its server down, its output gone)."""
    records: Counter[str] = Counter()
    for sink in _sinks(job):
        read = registry.sink_kind(sink.get("type", "")).committed
        if read is None:
            continue
        try:
            records.update(_canonical(r) for r in read(sink.get("config", {})))
        except Exception as err:  # whatever its client raises: said in one line, as a run's failure is
            said = " ".join(str(err).split())
            raise ChaosFailed(f"could not read what sink '{sink.get('id')}' committed: {said}") from err
    return records


def _canonical(record: Any) -> str:
    return record if isinstance(record, str) else json.dumps(record, sort_keys=True, default=str)
