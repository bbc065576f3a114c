"""The `nopstream` command: run, chaos, validate, plan, diff, crd, status; `task` and `coordinator` in pods.

Exit codes: 0 ok, 1 invalid input (or a refused change for `diff`, a refused start for
`run`), 2 usage error, 3 the job cannot start or failed while running, 70 an internal
error (its traceback is written to a file), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from nopstream import safefiles, stacks
from nopstream.model.errors import ModelError
from nopstream.model.load import LoadedModel, load_file
from nopstream.node import recovery
from nopstream.plan import compiler

# Commands import what only they use, so that a task process (`nopstream task`,
# started once per task) loads no more than it needs.

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_JOB_FAILED = 3
EXIT_INTERNAL = 70  # EX_SOFTWARE
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as the default action gives


class Terminated(KeyboardInterrupt):
    """`nopstream run` got SIGTERM: it unwinds as from Ctrl-C, stopping its task processes (a
    KeyboardInterrupt, so that asyncio passes it through its task groups as it is)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nopstream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("run", help="run a job on this machine (the embedded default)")
    p.add_argument("file")
    p.add_argument("--in-process", action="store_true", help="all tasks in this process over local queues")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--workdir", type=_directory, default=".nopstream", help="run files and logs (default .nopstream)"
    )
    p.add_argument(
        "--restore-from",
        type=_at_least(1),
        metavar="EPOCH",
        help="start a new lineage from this durable epoch (default: go on from the latest)",
    )
    p.add_argument("--fresh", action="store_true", help="start over: a new lineage that restores nothing")
    p.add_argument(
        "--max-restarts", type=_at_least(0), default=10, help="global recoveries before failing (default 10)"
    )
    p.add_argument(
        "--restart-backoff",
        type=_seconds,
        default=recovery.RestartPolicy.backoff_s,
        metavar="SECONDS",
        help="the wait before a second recovery in quick succession, doubling after (default 0.25; 0: none)",
    )
    p.add_argument(
        "--etcd",
        type=_host_port,
        metavar="HOST:PORT",
        help="coordinate through this etcd server: coordinator and task processes as on Kubernetes",
    )
    p = sub.add_parser(
        "chaos", help="run a job clean, then under random SIGKILLs; compare the committed outputs exactly"
    )
    p.add_argument("file")
    p.add_argument(
        "--kills", type=_at_least(1), default=10, help="SIGKILLs in the run under faults (default 10)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the kill moments and victims (default 0)")
    p.add_argument(
        "--etcd", type=_host_port, metavar="HOST:PORT", help="run the job as `nopstream run --etcd` does"
    )
    p.add_argument(
        "--workdir",
        type=_directory,
        default=".nopstream/chaos",
        help="checkpoints and outputs of both runs (default .nopstream/chaos)",
    )
    p.add_argument(
        "--timeout", type=_positive_seconds, default=600.0, help="seconds each run may take (default 600)"
    )
    p.add_argument(
        "--pace",
        type=_at_least(0),
        default=0,
        metavar="MS",
        help="each source pauses MS ms after each batch of at most 100 records, in both runs, so a short"
        " job lasts long enough for its kills to land (default 0)",
    )
    p.add_argument(
        "--allow-shallow",
        action="store_true",
        help="exit 0 on equal outputs even when no kill restored state or a fault point was not reached",
    )
    sub.add_parser(
        "task", help="run one task of a cluster job (identity and plan from NOPSTREAM_* variables)"
    )
    sub.add_parser(
        "coordinator", help="run one coordinator candidate of a cluster job (from NOPSTREAM_* variables)"
    )
    p = sub.add_parser(
        "savepoint", help="make the next epoch of a running job a savepoint (kept by retention)"
    )
    p.add_argument("file", help="the job's file")
    p.add_argument(
        "--stop",
        action="store_true",
        help="stop the job at the savepoint, its output committed (then run a changed version from it)",
    )
    _coordinator_arguments(p)
    p = sub.add_parser("operator", help="run the Kubernetes operator (kopf) in this process, cluster-wide")
    p.add_argument(
        "--liveness", metavar="URL", help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    p = sub.add_parser("validate", help="check a StreamJob or StreamModel file; list every issue")
    p.add_argument("file")
    _backend_arguments(p)
    p = sub.add_parser("plan", help="compile a model and print one plan layer")
    p.add_argument("file")
    p.add_argument("--layer", choices=sorted(compiler.LAYERS), default="partitioned")
    p.add_argument("--format", choices=["text", "json"], default="text")
    _backend_arguments(p)
    p = sub.add_parser("diff", help="plan diff and compatibility verdict of OLD -> NEW")
    p.add_argument("old")
    p.add_argument("new")
    sub.add_parser("crd", help="print the StreamJob CustomResourceDefinition")
    p = sub.add_parser(
        "status",
        help="a running job's view (its file: what the dashboard shows), or a checkpoint directory's epochs",
    )
    p.add_argument(
        "target",
        help="the job's file (ask its coordinator), or a checkpoint storage directory (read it)",
    )
    _coordinator_arguments(p)
    p.add_argument("--url", help="the coordinator's address (e.g. a port-forward), instead of finding it")
    p.add_argument("--json", action="store_true", help="print GET /api/v1/job as it came")
    return parser


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `low`."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < low:
            raise argparse.ArgumentTypeError(f"{number} is below {low}")
        return number

    return parse


def _seconds(value: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is not a number of seconds, 0 or more")
    return seconds


def _positive_seconds(value: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    seconds = _seconds(value)
    if seconds == 0:
        raise argparse.ArgumentTypeError(f"{value} is not a number of seconds above 0")
    return seconds


def _host_port(value: str) -> str:
    """An argparse type: HOST:PORT with a port from 1 to 65535."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (a port from 1 to 65535)")
    return value


def _directory(value: str) -> str:
    """An argparse type: a directory path, not empty."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path is not a directory")
    return value


def _coordinator_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workdir",
        type=_directory,
        default=".nopstream",
        help="run files of `nopstream run` (default .nopstream)",
    )
    p.add_argument(
        "--etcd",
        type=_host_port,
        metavar="HOST:PORT",
        help="the job runs with --etcd: ask its leading coordinator",
    )
    p.add_argument(
        "--secret-file",
        metavar="FILE",
        help="the job's secret with --etcd or --url (default: the one `nopstream run` keeps in --workdir)",
    )


def _backend_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=["local", "kubernetes"],
        default="local",
        help="where the job runs: `nopstream run` (local) or the operator (kubernetes)",
    )
    p.add_argument(
        "--namespace", help="the Kubernetes namespace, with --backend kubernetes (default: default)"
    )


def _fail(err: ModelError) -> int:
    print(f"invalid: {len(err.issues)} issue(s)", file=sys.stderr)
    for issue in err.issues:
        print(f"  {issue}", file=sys.stderr)
    return EXIT_INVALID


def _compile(loaded: LoadedModel, args: argparse.Namespace) -> compiler.CompiledPlans:
    namespace = "local" if args.backend == "local" else args.namespace or "default"
    return compiler.compile_model(loaded, backend=args.backend, namespace=namespace)


def cmd_validate(args: argparse.Namespace) -> int:
    """Print OK and the fingerprint, or every issue (user functions imported too); exit 1 when invalid."""
    from nopstream.local import preflight

    loaded = load_file(args.file)
    plans = _compile(loaded, args)
    issues = preflight.function_issues(loaded, [str(Path(args.file).resolve().parent)], absent_ok=True)
    if issues:
        raise ModelError(issues)
    print(f"{args.file}: valid StreamModel of job '{plans.partitioned.identity.job_id}'")
    print(f"  partitioned plan {plans.deployment.partitioned_fingerprint}")
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the chosen plan layer as text or as a plan document (JSON)."""
    from nopstream.plan import render

    plan = _compile(load_file(args.file), args).layer(args.layer)
    print(compiler.dump_document(plan) if args.format == "json" else render.render(plan))
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """Print the partitioned-plan diff and the verdict; exit 1 when the change is refused."""
    from nopstream.plan import compat, diff

    old_loaded, new_loaded = load_file(args.old), load_file(args.new)
    old = compiler.compile_model(old_loaded).partitioned
    new = compiler.compile_model(new_loaded).partitioned
    lines = diff.diff(old, new)
    print(f"plan diff {args.old} -> {args.new}:")
    print("\n".join(f"  {line}" for line in lines) if lines else "  (no difference)")
    verdict = compat.check_compatibility(old, new, drop_state=new_loaded.model.drop_state)
    print(f"verdict: {verdict.change.name}")
    for reason in verdict.reasons:
        print(f"  {reason}")
    return EXIT_INVALID if verdict.change is compat.ChangeKind.REFUSED else EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """Run a job to completion on this machine; exit 3 with the task's error when it fails."""
    from nopstream.local import launch, runner

    loaded = load_file(args.file)
    _unwind_on_sigterm()
    options = runner.RunOptions(
        in_process=args.in_process,
        quiet=args.quiet,
        workdir=Path(args.workdir),
        python_path=(str(Path(args.file).resolve().parent),),
        restore_from=args.restore_from,
        fresh=args.fresh,
        max_restarts=args.max_restarts,
        restart_backoff=args.restart_backoff,
        drop_state=tuple(loaded.model.drop_state),
    )
    if args.etcd and args.in_process:
        print("nopstream run: --etcd and --in-process exclude each other", file=sys.stderr)
        return EXIT_USAGE
    if args.fresh and args.restore_from is not None:
        print("nopstream run: --fresh and --restore-from exclude each other", file=sys.stderr)
        return EXIT_USAGE
    try:
        launched = launch.launch(loaded, options, etcd=args.etcd)
    except launch.RunError as err:
        print(err, file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt as stopped:  # Ctrl-C, or SIGTERM (Terminated): say what the next run finds
        terminated = isinstance(stopped, Terminated)
        how = "stopped by SIGTERM" if terminated else "interrupted"
        print(f"nopstream run: {how}: {launch.kept(compiler.compile_model(loaded))}", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    plans, result = launched.plans, launched.result
    job = plans.partitioned.identity.job_id
    if result.finished_before is not None:
        print(
            f"job '{job}' already finished at epoch {result.finished_before}"
            " (nothing emitted; --fresh starts it over)",
            file=sys.stderr,
        )
        return EXIT_OK
    if result.stopped_at is not None:
        print(
            f"job '{job}' stopped at savepoint epoch {result.stopped_at}, its output committed (running it"
            " again, or a changed version of it, resumes from there)",
            file=sys.stderr,
        )
        return EXIT_OK
    if not args.quiet:
        print(f"job '{job}' finished in {result.seconds:.2f}s", file=sys.stderr)
        for sink in _sinks(plans):
            print(f"  sink '{sink}' wrote to {sink_location(plans, sink)}", file=sys.stderr)
    return EXIT_OK


def _sinks(plans: compiler.CompiledPlans) -> list[str]:
    return [op.node_id for op in plans.partitioned.operators().values() if op.kind == "sink"]


def sink_location(plans: compiler.CompiledPlans, sink_id: str) -> str:
    """Where a sink's output goes, in words."""
    from nopstream.local import ownership

    node = plans.partitioned.operators()[sink_id]
    return ownership.sink_location(node) or node.type


def cmd_node(args: argparse.Namespace) -> int:
    """Run a task or coordinator process of a cluster job; exit 2 on bad settings, 3 when it fails."""
    import asyncio
    import logging

    from nopstream.node import coordinator, lifetime, liveness, recovery, settings, task

    try:
        config = settings.from_env(args.command)
    except settings.SettingsError as err:
        print(f"nopstream {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE
    if config.parent is not None:
        lifetime.die_with_parent(config.parent)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _exit_on_sigterm(args.command)
    if config.health_port is not None:
        liveness.serve(config.host, config.health_port)
    if args.command == "coordinator":
        _leave(EXIT_OK if asyncio.run(coordinator.serve(config)) == 0 else EXIT_JOB_FAILED)
    from nopstream.errors import RestoreRefused
    from nopstream.node import cpu

    cpu.ask_for_long_turns()
    try:
        asyncio.run(task.serve(config))
    except task.LeaseLost as lost:
        print(f"nopstream task: {lost}", file=sys.stderr)
        _leave(EXIT_JOB_FAILED)
    except RestoreRefused as refused:  # the same for every attempt: not a failure to recover from
        recovery.exit_refused(refused)
    _leave(EXIT_OK)


def _leave(code: int) -> NoReturn:
    """End a task or coordinator process now: its outcome is decided and written.

    The interpreter's finalization is skipped: it would run the destructors of clients
    left open (a Kafka client's may wait on its broker), and a process that does not
    end keeps its pod Running and its job unfinished. Crash-only: nothing is lost.
    """
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _unwind_on_sigterm() -> None:
    """SIGTERM raises Terminated: the command stops its task processes and removes its run files
    (`control-url`, `secret`) as on Ctrl-C, instead of dying with them left behind."""
    import signal

    def stop(_signum: int, _frame: object) -> None:
        raise Terminated

    if threading.current_thread() is threading.main_thread():  # signals go to the main thread only
        signal.signal(signal.SIGTERM, stop)


def _exit_on_sigterm(command: str) -> None:
    """Exit at once on SIGTERM, with the status its default action gives (143).

    A container's first process has no default signal actions: without a handler it
    would ignore SIGTERM and its pod would take the whole grace period to stop. Exiting
    without cleanup is what the default action does outside a container, and what a job
    recovers from anyway: its state is in its durable epochs, not in this process.
    """
    import signal

    def stop(signum: int, _frame: object) -> None:
        print(f"nopstream {command}: stopped by SIGTERM", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def cmd_chaos(args: argparse.Namespace) -> int:
    """Exit 0 when the output under kills equals the failure-free output (and the kills reached state and
    every step, unless --allow-shallow), 1 when not, 3 when a run fails."""
    from nopstream.local import chaos

    compiler.compile_model(load_file(args.file))  # refuse an invalid job first
    settings = chaos.ChaosSettings(
        kills=args.kills,
        seed=args.seed,
        etcd=args.etcd,
        workdir=Path(args.workdir),
        timeout=args.timeout,
        allow_shallow=args.allow_shallow,
        pace_ms=args.pace,
    )
    try:
        return chaos.run_chaos(Path(args.file), settings)
    except chaos.ChaosFailed as failed:
        print(f"chaos: {failed}", file=sys.stderr)
        return EXIT_JOB_FAILED


def cmd_savepoint(args: argparse.Namespace) -> int:
    """Ask a running job's coordinator for a savepoint; exit 1 when no coordinator answers."""
    if args.stop and args.etcd:  # its supervisor would wait for tasks that stopped at the savepoint
        print(
            "nopstream savepoint: --stop applies to `nopstream run` without --etcd (on Kubernetes the"
            " operator stops a job at a savepoint itself)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    plans = compiler.compile_model(load_file(args.file))
    job = plans.partitioned.identity.job_id
    answer = _ask_coordinator(plans, args, "POST", "/savepoint?stop=true" if args.stop else "/savepoint")
    if answer is None:
        return EXIT_INVALID
    done = ", ".join(map(str, answer.get("savepoints", []))) or "none yet"
    then = " and the job stops at it" if args.stop else ""
    print(
        f"savepoint requested: the next epoch of job '{job}' is a savepoint{then} (savepoints so far: {done})"
    )
    return EXIT_OK


def _ask_coordinator(
    plans: compiler.CompiledPlans, args: argparse.Namespace, method: str, path: str
) -> dict[str, Any] | None:
    """The JSON answer of the job's coordinator to one request; None (said on stderr) when none answers."""
    import json
    import urllib.error
    import urllib.request

    from nopstream.node import guard

    job = plans.partitioned.identity.job_id
    url = getattr(args, "url", None)
    if url and not args.secret_file:
        print(f"nopstream {args.command}: --url needs --secret-file (the job's secret)", file=sys.stderr)
        return None
    from nopstream.cluster.backend import StoreUnavailable

    try:
        found = (url.rstrip("/"), Path(args.secret_file or "")) if url else _coordinator(plans, args)
    except StoreUnavailable as err:
        print(f"job '{job}': etcd at {args.etcd} did not answer: {err}", file=sys.stderr)
        return None
    if found is None:
        print(f"job '{job}' is not running (no coordinator found)", file=sys.stderr)
        return None
    base, secret_file = found
    try:
        secret = guard.read_secret(secret_file)
    except guard.SecretError as err:
        print(f"job '{job}': {err}", file=sys.stderr)
        return None
    request = urllib.request.Request(f"{base}{path}", method=method, headers=guard.headers(secret))
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            answer: dict[str, Any] = json.loads(r.read())
    except urllib.error.HTTPError as refused:  # it answered, and said no
        why = refused.read().decode(errors="replace")
        print(
            f"job '{job}': the coordinator at {base} refused {path} ({refused.code}): {why}", file=sys.stderr
        )
        return None
    except (urllib.error.URLError, OSError, ValueError) as err:
        print(f"job '{job}': the coordinator at {base} did not answer {path}: {err}", file=sys.stderr)
        return None
    return answer


def _coordinator(plans: compiler.CompiledPlans, args: argparse.Namespace) -> tuple[str, Path] | None:
    """Where the job's coordinator listens and the file of the job's secret.

    The leader in etcd (the secret of `nopstream run --etcd` in the working directory,
    or `--secret-file`), or the latest local run's control server and its secret.
    """
    runs = Path(args.workdir) / "runs" / plans.partitioned.identity.job_id
    if args.etcd:
        import asyncio

        from nopstream.cluster.election import Election
        from nopstream.cluster.etcd import EtcdBackend
        from nopstream.cluster.layout import Layout

        async def leader() -> str | None:
            host, _, port = args.etcd.rpartition(":")
            backend = EtcdBackend(host, int(port))
            ident = plans.partitioned.identity
            try:
                layout = Layout(plans.deployment.namespace, ident.job_id, ident.pipeline_id)
                return await Election(backend, layout, "cli").leader_endpoint()
            finally:
                await backend.close()

        endpoint = asyncio.run(leader())
        secret = Path(args.secret_file) if args.secret_file else runs / "cluster" / "secret"
        return None if endpoint is None else (endpoint, secret)
    # the newest: run numbers start again at 1 with each command, and a killed one leaves its file
    found = sorted(runs.glob("run-*/control-url"), key=lambda p: p.stat().st_mtime)
    return (found[-1].read_text().strip(), found[-1].parent / "secret") if found else None


def cmd_operator(args: argparse.Namespace) -> int:
    """Run the operator until it is stopped."""
    from nopstream_operator import handlers

    handlers.run(liveness=args.liveness)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """A running job's view from its coordinator, or a checkpoint directory's epochs; 1 when neither."""
    target = Path(args.target)
    if target.is_dir():
        return _storage_status(target)
    if not target.is_file():
        print(
            f"{target}: no such file or directory (give a job's file or a checkpoint directory)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    import json

    from nopstream.node.jobview import render_view

    plans = compiler.compile_model(load_file(args.target))
    view = _ask_coordinator(plans, args, "GET", "/api/v1/job")
    if view is None:
        return EXIT_INVALID
    print(json.dumps(view, indent=2) if args.json else "\n".join(render_view(view)))
    return EXIT_OK


def _storage_status(root: Path) -> int:
    """Print each job's durable epochs and its latest manifest; exit 1 when DIR has none or one is refused."""
    from nopstream.checkpoint import catalog, lineage
    from nopstream.checkpoint.storage import LocalStorage
    from nopstream.errors import RestoreRefused, StorageError

    if not (root / "checkpoint").is_dir():
        print(f"{root}: no checkpoints here (expected {root / 'checkpoint'})", file=sys.stderr)
        return EXIT_INVALID
    try:
        storage = LocalStorage(root)
    except StorageError as err:
        print(f"{root}: {err}", file=sys.stderr)
        return EXIT_INVALID
    namespaces = sorted({"/".join(Path(p).parts[1:3]) for p in storage.list("checkpoint/")})
    code = EXIT_OK
    for ns in namespaces:
        epochs = catalog.durable_epochs(storage, ns)
        print(f"{ns}: durable epochs {', '.join(map(str, epochs)) or 'none'}")
        try:
            line = lineage.current(storage, ns)
        except RestoreRefused as refused:
            print(f"  lineage record refused: {refused}")
        else:
            base = f", from epoch {line.base}" if line.base is not None else ""
            print(f"  lineage {line.number}: epochs from {line.first_epoch}{base}")
        if not epochs:
            continue
        try:
            m = catalog.read_manifest(storage, ns, epochs[-1])
        except RestoreRefused as refused:
            print(f"  latest manifest refused: {refused}")
            code = EXIT_INVALID
            continue
        segments = m.segments()
        pending = sum(len(v) for v in m.sinks.values())
        print(f"  latest: epoch {m.epoch} ({m.kind}) at {m.created_at}, plan {m.plan_fingerprint}")
        size = sum(s.bytes for s in segments)
        print(
            f"  {len(m.tasks)} tasks, {len(segments)} segments, {size:,} bytes,"
            f" {pending} pending sink transactions, checksum {m.checksum[:16]}"
        )
    print("(the epoch log of a local run lives in the runner's memory; storage holds the truth)")
    return code


def cmd_crd(args: argparse.Namespace) -> int:
    """Print the StreamJob CRD as YAML."""
    print(dump_crd(), end="")
    return EXIT_OK


def dump_crd() -> str:
    """The CRD YAML exactly as `crds/streamjob.yaml` holds it."""
    import yaml

    from nopstream.model import crd

    header = "# Generated by `nopstream crd` from nopstream/model; do not edit by hand.\n"
    return header + yaml.safe_dump(crd.streamjob_crd(), sort_keys=False, width=100)


_COMMANDS = {
    "run": cmd_run,
    "chaos": cmd_chaos,
    "task": cmd_node,
    "coordinator": cmd_node,
    "validate": cmd_validate,
    "plan": cmd_plan,
    "diff": cmd_diff,
    "crd": cmd_crd,
    "status": cmd_status,
    "savepoint": cmd_savepoint,
    "operator": cmd_operator,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code.

    No traceback reaches a user: an unexpected error is an internal one (exit 70), its
    traceback written to a file the message names. The processes of a cluster job
    (`task`, `coordinator`, `operator`) keep theirs in their logs.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        stacks.install()  # `kill -USR1` shows where a process waits, in its log
    if getattr(args, "namespace", None) is not None and getattr(args, "backend", None) == "local":
        parser.error("--namespace is a Kubernetes namespace: it needs --backend kubernetes")
    try:
        return _COMMANDS[args.command](args)
    except ModelError as err:
        return _fail(err)
    except safefiles.UnsafePath as err:
        print(f"nopstream {args.command}: {err}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except BrokenPipeError:
        return EXIT_OK
    except Terminated:
        print(
            f"nopstream {args.command}: stopped by SIGTERM (running the job again resumes from its"
            " latest durable epoch)",
            file=sys.stderr,
        )
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.command in _LOGGED_COMMANDS:
            raise
        return _internal_error(args.command, exc)


_LOGGED_COMMANDS = frozenset({"task", "coordinator", "operator"})


def _internal_error(command: str, exc: Exception) -> int:
    """Say that an unexpected error is ours, and where its traceback is (a new file of this user's)."""
    import time
    import traceback

    text = "".join(traceback.format_exception(exc))
    try:
        path = safefiles.user_dir() / f"internal-error-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        safefiles.replace_file(path, text.encode())
        where = f"the traceback is in {path}"
    except OSError:  # no private place to keep it: the traceback goes with the message
        where = f"its traceback:\n{text}"
    print(
        f"nopstream {command}: internal error: {type(exc).__name__}: {exc}"
        f" (this is a bug of nopstream; {where})",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
