"""The commands on a job's file: validate, plan, diff, run, chaos, and crd."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nopstream import exits
from nopstream.cli import startup
from nopstream.cli.signals import terminated, unwind_on_sigterm
from nopstream.cluster.etcd_access import START_WAIT_S
from nopstream.model.errors import ModelError
from nopstream.model.load import LoadedModel, load_file
from nopstream.plan import compiler


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
    return exits.OK


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the chosen plan layer as text or as a plan document (JSON)."""
    from nopstream.plan import render

    plan = _compile(load_file(args.file), args).layer(args.layer)
    print(compiler.dump_document(plan) if args.format == "json" else render.render(plan))
    return exits.OK


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
    return exits.INVALID if verdict.change is compat.ChangeKind.REFUSED else exits.OK


def cmd_run(args: argparse.Namespace) -> int:
    """Run a job to completion on this machine; exit 3 with the task's error when it fails."""
    from nopstream.local import launch, runner

    startup.loaded()
    loaded = load_file(args.file)
    unwind_on_sigterm()
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
        return exits.USAGE
    if args.etcd_wait is not None and not args.etcd:
        print("nopstream run: --etcd-wait needs --etcd", file=sys.stderr)
        return exits.USAGE
    if args.fresh and args.restore_from is not None:
        print("nopstream run: --fresh and --restore-from exclude each other", file=sys.stderr)
        return exits.USAGE
    try:
        wait = START_WAIT_S if args.etcd_wait is None else args.etcd_wait
        launched = launch.launch(loaded, options, etcd=args.etcd, etcd_wait=wait)
    except launch.RunError as err:
        print(err, file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (`unwind_on_sigterm`): say what the next run finds
        how = "stopped by SIGTERM" if terminated() else "interrupted"
        print(f"nopstream run: {how}: {launch.kept(compiler.compile_model(loaded))}", file=sys.stderr)
        return exits.TERMINATED if terminated() else exits.INTERRUPTED
    plans, result = launched.plans, launched.result
    job = plans.partitioned.identity.job_id
    if result.finished_before is not None:
        print(
            f"job '{job}' already finished at epoch {result.finished_before}"
            " (nothing emitted; --fresh starts it over)",
            file=sys.stderr,
        )
        return exits.OK
    if result.stopped_at is not None:
        print(
            f"job '{job}' stopped at savepoint epoch {result.stopped_at}, its output committed (running it"
            " again, or a changed version of it, resumes from there)",
            file=sys.stderr,
        )
        return exits.OK
    if not args.quiet:
        print(f"job '{job}' finished in {result.seconds:.2f}s", file=sys.stderr)
        for sink in _sinks(plans):
            print(f"  sink '{sink}' wrote to {sink_location(plans, sink)}", file=sys.stderr)
    return exits.OK


def _sinks(plans: compiler.CompiledPlans) -> list[str]:
    return [op.node_id for op in plans.partitioned.operators().values() if op.kind == "sink"]


def sink_location(plans: compiler.CompiledPlans, sink_id: str) -> str:
    """Where a sink's output goes, in words."""
    from nopstream.local import ownership

    node = plans.partitioned.operators()[sink_id]
    return ownership.sink_location(node) or node.type


def cmd_chaos(args: argparse.Namespace) -> int:
    """Exit 0 when the output under kills equals the failure-free output (and the kills reached state and
    every step, unless --allow-shallow), 1 when not, 3 when a run fails."""
    from nopstream.local import chaos

    startup.loaded()
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
        return exits.JOB_FAILED


def cmd_crd(args: argparse.Namespace) -> int:
    """Print the StreamJob CRD as YAML."""
    print(dump_crd(), end="")
    return exits.OK


def dump_crd() -> str:
    """The CRD YAML exactly as `crds/streamjob.yaml` holds it."""
    import yaml

    from nopstream.model import crd

    header = "# Generated by `nopstream crd` from nopstream/model; do not edit by hand.\n"
    return header + yaml.safe_dump(crd.streamjob_crd(), sort_keys=False, width=100)
