"""A child process with its log, once for the runner's task processes, the supervisor's and the test
servers: polled, signalled, waited for and stopped by PID (SIGTERM, a grace period, SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(eq=False)
class Child:
    """A child of this process: forked (`popen` None) or started from a command line (`spawn`)."""

    name: str
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    group: bool = False
    """It leads a session of its own: `stop` signals its whole process group."""
    returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once it has ended (negative: killed by that signal), else None."""
        if self.returncode is None:
            if self.popen is not None:
                self.returncode = self.popen.poll()
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.poll() is None

    def signal(self, sig: int) -> None:
        """Send `sig` to it (not its group) while it runs."""
        if self.alive():
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int | None:
        """Wait up to `timeout` seconds for its exit code."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.returncode

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log ('' before it has one)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL it at once (its whole process group when it leads one)."""
        self._send(signal.SIGKILL)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; reap it."""
        stop_all([self], grace)

    def _send(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(self.pid, sig)
            elif self.alive():
                os.kill(self.pid, sig)


def spawn(
    name: str,
    argv: list[str],
    *,
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    session: bool = False,
    user: str | None = None,
) -> Child:
    """Start `argv` (as `user`, when given; in a session of its own with `session`), its stdout and
    stderr appended to `log`, its environment `env` (this process's when None)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=session,
            user=user,
            group=user,
        )
    return Child(name, popen.pid, log, popen, group=session)


def stop_all(children: Iterable[Child], grace: float = 5.0) -> None:
    """Stop every live one: SIGTERM, then SIGKILL after `grace` seconds; reap them all."""
    live = [c for c in children if c.poll() is None]
    for child in live:
        child._send(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in live:
        if child.wait(max(0.0, deadline - time.monotonic())) is None:
            child._send(signal.SIGKILL)
            child.wait(10)
