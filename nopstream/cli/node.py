"""The processes of a cluster job and the operator: `nopstream task`, `coordinator`, `operator`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from nopstream import exits
from nopstream.cli import startup
from nopstream.cli.signals import exit_on_sigterm

if TYPE_CHECKING:
    from nopstream.node.resident import Start
    from nopstream.node.settings import NodeSettings


def cmd_node(args: argparse.Namespace) -> int:
    """Run a task or coordinator process of a cluster job; exit 2 on bad settings, 3 when it fails."""
    import asyncio
    import logging

    from nopstream.node import coordinator, lifetime, liveness, resident, settings

    try:
        config = settings.from_env(args.command)
    except settings.SettingsError as err:
        print(f"nopstream {args.command}: {err}", file=sys.stderr)
        return exits.USAGE
    if config.parent is not None:
        lifetime.die_with_parent(config.parent)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    exit_on_sigterm(args.command)
    if args.command == "task":  # imported once, here: the task processes a pod forks inherit it
        from nopstream.node import task  # noqa: F401
    startup.loaded()
    if args.command == "coordinator":
        if config.health_port is not None:
            liveness.serve(config.host, config.health_port)
        _leave(exits.OK if asyncio.run(coordinator.serve(config)) == 0 else exits.JOB_FAILED)
    if config.resident:  # a pod's: a task process forked per run it serves
        _leave(resident.host(lambda start: _task(config, start)))
    _task(config)


def _task(config: NodeSettings, start: Start | None = None) -> NoReturn:
    """Serve one task of one run (`node.task.serve`), then end the process with its exit code."""
    from nopstream.errors import RestoreRefused
    from nopstream.node import cpu, lifetime, liveness, recovery, task

    if config.health_port is not None:
        liveness.serve(config.host, config.health_port)
    cpu.ask_for_long_turns()
    try:
        lifetime.run_to_end(task.serve(config, start))
    except task.LeaseLost as lost:
        print(f"nopstream task: {lost}", file=sys.stderr)
        _leave(exits.JOB_FAILED)
    except RestoreRefused as refused:  # the same for every attempt: not a failure to recover from
        recovery.exit_refused(refused)
    _leave(exits.OK)


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


def cmd_operator(args: argparse.Namespace) -> int:
    """Run the operator until it is stopped."""
    from nopstream_operator import handlers

    startup.loaded()
    handlers.run(liveness=args.liveness)
    return exits.OK
