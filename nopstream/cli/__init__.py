"""The `nopstream` command: one module per group of commands, the dispatch and the last word here.

Commands import what only they use, so that a task process (`nopstream task`, started
once per task) loads no more than it needs. Exit codes: `nopstream.exits`.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Sequence

from nopstream import exits, safefiles, stacks
from nopstream.cli import arguments, coordinator, jobs, node, signals, startup
from nopstream.model.errors import ModelError

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": jobs.cmd_run,
    "chaos": jobs.cmd_chaos,
    "task": node.cmd_node,
    "coordinator": node.cmd_node,
    "validate": jobs.cmd_validate,
    "plan": jobs.cmd_plan,
    "diff": jobs.cmd_diff,
    "crd": jobs.cmd_crd,
    "status": coordinator.cmd_status,
    "savepoint": coordinator.cmd_savepoint,
    "operator": node.cmd_operator,
}
_LOADING_THEIR_OWN = frozenset({"run", "chaos", "task", "coordinator", "operator"})
"""The commands that import their modules as they start, then call `startup.loaded` themselves."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code.

    No traceback reaches a user: an unexpected error is an internal one (exit 70), its
    traceback written to a file the message names. The processes of a cluster job
    (`task`, `coordinator`, `operator`) keep theirs in their logs.
    """
    parser = arguments.parser()
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        stacks.install()  # `kill -USR1` shows where a process waits, in its log
    if getattr(args, "namespace", None) is not None and getattr(args, "backend", None) == "local":
        parser.error("--namespace is a Kubernetes namespace: it needs --backend kubernetes")
    if args.command not in _LOADING_THEIR_OWN:
        startup.loaded()
    try:
        return _COMMANDS[args.command](args)
    except ModelError as err:
        return _fail(err)
    except safefiles.UnsafePath as err:
        print(f"nopstream {args.command}: {err}", file=sys.stderr)
        return exits.JOB_FAILED
    except BrokenPipeError:
        return exits.OK
    except KeyboardInterrupt:
        if not signals.terminated():
            return exits.INTERRUPTED
        print(
            f"nopstream {args.command}: stopped by SIGTERM (running the job again resumes from its"
            " latest durable epoch)",
            file=sys.stderr,
        )
        return exits.TERMINATED
    except Exception as exc:
        if args.command in _LOGGED_COMMANDS:
            raise
        return _internal_error(args.command, exc)


_LOGGED_COMMANDS = frozenset({"task", "coordinator", "operator"})


def _fail(err: ModelError) -> int:
    print(f"invalid: {len(err.issues)} issue(s)", file=sys.stderr)
    for issue in err.issues:
        print(f"  {issue}", file=sys.stderr)
    return exits.INVALID


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
    return exits.INTERNAL
