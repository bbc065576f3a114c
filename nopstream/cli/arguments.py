"""The command line's arguments: one parser of every command, and the types that check them."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from nopstream.cluster.etcd_access import START_WAIT_S
from nopstream.node import recovery
from nopstream.plan import compiler

DESCRIPTION = """The `nopstream` command: run, chaos, validate, plan, diff, crd, status; `task` and
`coordinator` in pods.

Exit codes: 0 ok, 1 invalid input (or a refused change for `diff`, a refused start for
`run`), 2 usage error, 3 the job cannot start or failed while running, 70 an internal
error (its traceback is written to a file), 130 interrupted.
"""


def parser() -> argparse.ArgumentParser:
    """The parser of every command's arguments."""
    parser = argparse.ArgumentParser(prog="nopstream", description=DESCRIPTION)
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
    p.add_argument(
        "--etcd-wait",
        type=_positive_seconds,
        metavar="SECONDS",
        help=f"with --etcd: how long to wait for etcd to answer at the start (default {START_WAIT_S:g})",
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
        help="each source of the run under kills pauses MS ms after each batch of at most 100 records, so"
        " a short job lasts long enough for its kills to land (default 0)",
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
