"""A task or coordinator process of a cluster job, from its environment to its exit: what `nopstream
task` and `nopstream coordinator` run, in a pod or forked by `nopstream run --etcd` (`local.zygote`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from nopstream import exits

if TYPE_CHECKING:
    from nopstream.node.resident import Start
    from nopstream.node.settings import NodeSettings


def main(role: str, *, loaded: Callable[[], None]) -> int:
    """Run the `role` ("task" or "coordinator") its environment describes; exit 2 on bad settings, 3 when
    it fails. `loaded` is called once the role's modules are imported (`cli.startup.loaded`)."""
    import asyncio
    import logging

    from nopstream.node import coordinator, lifetime, liveness, resident, settings

    try:
        config = settings.from_env(role)
    except settings.SettingsError as err:
        print(f"nopstream {role}: {err}", file=sys.stderr)
        return exits.USAGE
    if config.parent is not None:
        lifetime.die_with_parent(config.parent)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    exit_on_sigterm(role)
    if role == "task":  # imported once, here: the task processes a pod forks inherit it
        from nopstream.node import task  # noqa: F401
    loaded()
    if role == "coordinator":
        if config.health_port is not None:
            liveness.serve(config.host, config.health_port)
        _leave(exits.OK if asyncio.run(coordinator.serve(config)) == 0 else exits.JOB_FAILED)
    if config.resident:  # a pod's: a task process forked per run it serves
        _leave(resident.host(lambda start: _task(config, start)))
    _task(config)


def exit_on_sigterm(role: str) -> None:
    """Exit at once on SIGTERM, with the status its default action gives (143).

    A container's first process has no default signal actions: without a handler it
    would ignore SIGTERM and its pod would take the whole grace period to stop. Exiting
    without cleanup is what the default action does outside a container, and what a job
    recovers from anyway: its state is in its durable epochs, not in this process.
    """
    import signal

    def stop(signum: int, _frame: object) -> None:
        print(f"nopstream {role}: stopped by SIGTERM", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


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
