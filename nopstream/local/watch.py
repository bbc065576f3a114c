"""How the runner watches one run's task processes: the run ends when every task finished, or with
its first failure, the task that died named as its cause."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

from nopstream.local import processes
from nopstream.local.children import Child
from nopstream.local.control import ControlServer


class TaskDied(RuntimeError):
    """A task process failed or died: the run is over and a global recovery may follow."""

    def __init__(self, short: str, detail: str) -> None:
        """`short` in a few words, `detail` the task's error or the end of its log."""
        super().__init__(f"{short}:\n{detail}")
        self.short = short
        self.detail = detail


def kill_a_task(procs: list[Child]) -> None:
    """A coordinator fault point fired: SIGKILL the last task process still running."""
    live = [p for p in procs if p.poll() is None]
    if live:
        live[-1].signal(signal.SIGKILL)


async def supervise(procs: list[Child], control: ControlServer) -> None:
    """Return when every task finished; raise the run's failure, naming its root where it can.

    A task killed by a signal comes before the failures its peers report (their
    channels to it broke), so a recovery's cause names the task that died.
    """
    with processes.waking_on_exit(procs, control.changed.set):
        await _until_finished(procs, control)


_CAUSE_GRACE_S = 0.3
"""How long a failure (a report, an exit) waits for a process killed by a signal to be seen exiting,
and an exit for the report its task sent before it: the killed one is the cause, and its peers'
broken channels may be reported before it is reaped."""


async def _until_finished(procs: list[Child], control: ControlServer) -> None:
    """Check every process and report at each change (a report, an exit) and every 0.1 s."""
    first_failure: float | None = None
    while True:
        for task_id, report in control.tasks.items():
            if report.refusal is not None:  # the same on every attempt: not recovered
                raise report.refusal.error(f"task {task_id}: ")
        codes = [(proc, proc.poll()) for proc in procs]
        for proc, code in codes:
            if code is not None and code < 0:
                raise _died(proc, code, control)
        failed = [(proc, code) for proc, code in codes if code is not None and code > 0]
        reported = [(task_id, r.error) for task_id, r in control.tasks.items() if r.error is not None]
        if failed or reported:
            first_failure = first_failure or time.monotonic()
            if time.monotonic() - first_failure >= _CAUSE_GRACE_S:
                # a task that reported its error and then exited is told by its error
                if reported:
                    task_id, error = reported[0]
                    raise TaskDied(f"task {task_id} failed: {_last_line(error)}", error.rstrip())
                proc, code = failed[0]
                raise _died(proc, code, control)
        if all(code == 0 for _, code in codes) and all(r.done for r in control.tasks.values()):
            return
        control.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.1):
                await control.changed.wait()


def _last_line(error: str) -> str:
    """The last line of a task's error (a traceback's exception), cut to 300 characters."""
    return next((line.strip()[:300] for line in reversed(error.splitlines()) if line.strip()), "")


def _died(proc: Child, code: int, control: ControlServer) -> TaskDied:
    """The failure of a task process that exited with `code`, recorded in the job's history."""
    tail = "\n".join(proc.log.read_text(errors="replace").splitlines()[-15:])
    control.routes.history.failed(control.run, proc.name, f"exited with {code}\n{tail}")
    return TaskDied(f"task {proc.name} exited with {code}", tail)
