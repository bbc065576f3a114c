"""The commands that ask a running job's coordinator, or read its checkpoints: savepoint and status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from nopstream import exits
from nopstream.model.load import load_file
from nopstream.plan import compiler

if TYPE_CHECKING:
    from nopstream.node.wire.coordinator_client import CoordinatorClient


def cmd_savepoint(args: argparse.Namespace) -> int:
    """Ask a running job's coordinator for a savepoint; exit 1 when no coordinator answers."""
    if args.stop and args.etcd:  # its supervisor would wait for tasks that stopped at the savepoint
        print(
            "nopstream savepoint: --stop applies to `nopstream run` without --etcd (on Kubernetes the"
            " operator stops a job at a savepoint itself)",
            file=sys.stderr,
        )
        return exits.USAGE
    plans = compiler.compile_model(load_file(args.file))
    job = plans.partitioned.identity.job_id
    savepoints = _ask_coordinator(plans, args, lambda coordinator: coordinator.savepoint(stop=args.stop))
    if savepoints is None:
        return exits.INVALID
    done = ", ".join(map(str, savepoints)) or "none yet"
    then = " and the job stops at it" if args.stop else ""
    print(
        f"savepoint requested: the next epoch of job '{job}' is a savepoint{then} (savepoints so far: {done})"
    )
    return exits.OK


T = TypeVar("T")


def _ask_coordinator(
    plans: compiler.CompiledPlans, args: argparse.Namespace, ask: Callable[[CoordinatorClient], T]
) -> T | None:
    """What `ask` gets from the job's coordinator; None (said on stderr) when none takes it."""
    from nopstream.cluster.backend import StoreUnavailable
    from nopstream.cluster.etcd_access import AccessError
    from nopstream.node.wire import guard
    from nopstream.node.wire.coordinator_client import CoordinatorClient, CoordinatorError
    from nopstream.node.wire.tls import JobTls, TlsError

    job = plans.partitioned.identity.job_id
    url = getattr(args, "url", None)
    if url and not args.secret_file:
        print(f"nopstream {args.command}: --url needs --secret-file (the job's secret)", file=sys.stderr)
        return None
    try:
        found = (url.rstrip("/"), Path(args.secret_file or "")) if url else _coordinator(plans, args)
    except StoreUnavailable as err:
        print(f"job '{job}': etcd at {args.etcd} did not answer: {err}", file=sys.stderr)
        return None
    except AccessError as err:
        print(f"nopstream {args.command}: {err}", file=sys.stderr)
        return None
    if found is None:
        print(f"job '{job}' is not running (no coordinator found)", file=sys.stderr)
        return None
    base, secret_file = found
    try:
        # a job that speaks TLS keeps its files beside its secret, as its pods and processes do
        tls = JobTls(secret_file.parent).client_context() if base.startswith("https://") else None
        return ask(CoordinatorClient(base, guard.read_secret(secret_file), tls=tls))
    except (guard.SecretError, TlsError) as err:
        print(f"job '{job}': {err}", file=sys.stderr)
    except CoordinatorError as err:
        print(f"job '{job}': the coordinator at {base} {err}", file=sys.stderr)
    return None


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
        from nopstream.cluster.etcd_access import access_from_env
        from nopstream.cluster.layout import Layout

        async def leader() -> str | None:
            host, _, port = args.etcd.rpartition(":")
            backend = EtcdBackend(host, int(port), access=access_from_env())
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
        return exits.INVALID
    import json

    from nopstream.node.view.jobview import render_view

    plans = compiler.compile_model(load_file(args.target))
    view = _ask_coordinator(plans, args, lambda coordinator: coordinator.job_view())
    if view is None:
        return exits.INVALID
    print(json.dumps(view, indent=2) if args.json else "\n".join(render_view(view)))
    return exits.OK


def _storage_status(root: Path) -> int:
    """Print each job's durable epochs and its latest manifest; exit 1 when DIR has none or one is refused."""
    from nopstream.checkpoint import catalog, lineage
    from nopstream.checkpoint.storage import LocalStorage
    from nopstream.errors import RestoreRefused, StorageError

    if not (root / "checkpoint").is_dir():
        print(f"{root}: no checkpoints here (expected {root / 'checkpoint'})", file=sys.stderr)
        return exits.INVALID
    try:
        storage = LocalStorage(root)
    except StorageError as err:
        print(f"{root}: {err}", file=sys.stderr)
        return exits.INVALID
    namespaces = sorted({"/".join(Path(p).parts[1:3]) for p in storage.list("checkpoint/")})
    code = exits.OK
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
            code = exits.INVALID
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
