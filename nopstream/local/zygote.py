"""The processes of `nopstream run --etcd`, forked ready-loaded instead of started from a command line.

A `python -m nopstream task` costs a Python start and its imports (0.85 CPU s each on a
loaded machine) for every task of every run and every coordinator candidate. The
supervisor instead forks a zygote as it starts, before it has a thread or an etcd
client (gRPC and asyncio do not survive a fork), with the modules of both roles
loaded. For each process the supervisor asks for, the zygote forks a short-lived
middle process that forks the process itself and exits: the process is then the
supervisor's child (the supervisor is a child subreaper, `PR_SET_CHILD_SUBREAPER`),
so the supervisor waits for its exit code, signals it and stops it by PID as any
child, and it dies with the supervisor (its parent-death signal, set by `nopstream
task` once the supervisor is its parent). The process runs what `nopstream task` and
`nopstream coordinator` run (`node.process.main`), with the environment, log and title
it was given.

The zygote dies with the supervisor, and ends when the supervisor closes its order pipe.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from nopstream.local.children import Child
from nopstream.local.processes import name_process
from nopstream.node import lifetime

_PR_SET_CHILD_SUBREAPER = 36
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
REPLY_S = 10.0
"""How long the supervisor waits for the zygote to name a process it forked."""
ADOPTED_S = 5.0
"""How long a forked process waits to become the supervisor's child before it gives up (exit 1)."""
_STOPS = {signal.SIGTERM, signal.SIGINT}


class ForkFailed(RuntimeError):
    """A process could not be forked: the zygote has ended, did not answer, or its fork failed (the
    message says which)."""


@dataclass(frozen=True)
class Order:
    """A process to fork: `nopstream ROLE` as TITLE in `ps`, with `env` as its whole environment, its
    stdout and stderr appended to `log`, and `path` first on its module path (as PYTHONPATH would)."""

    role: str
    title: str
    log: str
    env: Mapping[str, str] = field(repr=False)
    path: tuple[str, ...] = ()

    def to_line(self) -> bytes:
        """The order as one line of JSON."""
        return (
            json.dumps(
                {
                    "role": self.role,
                    "title": self.title,
                    "log": self.log,
                    "env": dict(self.env),
                    "path": self.path,
                }
            ).encode()
            + b"\n"
        )

    @classmethod
    def from_line(cls, line: bytes) -> Order:
        """The order `to_line` wrote."""
        data = json.loads(line)
        return cls(data["role"], data["title"], data["log"], data["env"], tuple(data["path"]))


class Zygote:
    """The supervisor's end: a zygote forked from this process, and the processes it forks for it."""

    def __init__(self, pid: int, orders: int, replies: int) -> None:
        self.process = Child("zygote", pid, Path(os.devnull))
        self._orders = orders
        self._replies = replies

    def fork(self, name: str, order: Order) -> Child:
        """Fork the process `order` describes as this process's child named `name`; ForkFailed when it
        cannot be (the process makes its log's directory itself)."""
        whose = f"the zygote (pid {self.process.pid}) that forks the job's processes"
        try:
            with open(self._orders, "wb", closefd=False) as orders:
                orders.write(order.to_line())
        except BrokenPipeError:
            raise ForkFailed(f"cannot start {name}: {whose} has ended") from None
        ready, _, _ = select.select([self._replies], [], [], REPLY_S)
        reply = os.read(self._replies, 4096).decode(errors="replace") if ready else ""
        if reply.startswith("!"):
            raise ForkFailed(f"cannot start {name}: {whose} could not fork it: {reply[1:].strip()}")
        if not reply.endswith("\n"):
            raise ForkFailed(f"cannot start {name}: {whose} did not answer within {REPLY_S:g} s")
        return Child(name, int(reply), Path(order.log))

    def close(self) -> None:
        """End the zygote (it reads the end of its orders) and reap it; the processes it forked live on."""
        os.close(self._orders)
        os.close(self._replies)
        if self.process.wait(5.0) is None:
            self.process.kill()
            self.process.wait(5.0)


def start(title: str, modules: Iterable[str], log: Path) -> Zygote:
    """Load `modules`, make this process a child subreaper and fork the zygote, shown as `title`, its
    own output appended to `log` from its first order on.

    WARNING: call it before this process starts a thread or an event loop: the zygote and
    every process it forks carry this process's memory as it is at the fork.
    """
    assert threading.active_count() == 1, "the zygote is forked from a process with one thread only"
    for module in modules:
        importlib.import_module(module)
    if _PRCTL(_PR_SET_CHILD_SUBREAPER, 1) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    orders_read, orders = os.pipe()
    replies, replies_write = os.pipe()
    supervisor = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)  # this process's handlers must never run there
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        os.close(orders_read)
        os.close(replies_write)
        return Zygote(pid, orders, replies)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the supervisor, which then ends it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    os.close(orders)
    os.close(replies)
    lifetime.end_forked(lambda: _serve(title, log, orders_read, replies_write, supervisor))


def _serve(title: str, log: Path, orders: int, replies: int, supervisor: int) -> None:
    """The zygote: fork each order read from `orders`, write each forked process's PID to `replies`."""
    name_process(title)
    lifetime.die_with_parent(supervisor)
    gc.freeze()  # what it holds is the supervisor's, shared with every process it forks
    with os.fdopen(orders, "rb") as incoming:
        for n, line in enumerate(incoming):
            if n == 0:  # not before: a command that cannot start leaves no log behind
                _take_output(log)
            try:
                reply = f"{_fork(Order.from_line(line), supervisor, (incoming.fileno(), replies))}\n"
            except OSError as err:  # out of processes or memory: the supervisor says so and fails
                reply = f"! {err}\n"
            os.write(replies, reply.encode())


def _take_output(log: Path) -> None:
    """Send stdout and stderr to `log` (appended): not to the supervisor's terminal."""
    log.parent.mkdir(parents=True, exist_ok=True)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)


def _fork(order: Order, supervisor: int, close: tuple[int, ...]) -> int:
    """Fork `order`'s process through a middle process; its PID once it is the supervisor's child."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read)
        lifetime.end_forked(lambda: _middle(order, supervisor, close, write))
    os.close(write)
    with os.fdopen(read, "rb") as named:
        said = named.read()
    os.waitpid(middle, 0)  # the middle has exited: its child is the supervisor's from here
    if not said:
        raise OSError("its fork failed (the zygote's log says why)")
    return int(said)


def _middle(order: Order, supervisor: int, close: tuple[int, ...], write: int) -> None:
    """Fork the order's process, name it to the zygote on `write`, and return (the middle then exits)."""
    pid = os.fork()
    if pid == 0:
        os.close(write)
        _become(order, supervisor, close)
    os.write(write, f"{pid}".encode())


def _become(order: Order, supervisor: int, close: tuple[int, ...]) -> NoReturn:
    """In the forked process: take the order's log, environment and title, then run `nopstream ROLE`."""

    def run() -> None:
        for fd in close:
            os.close(fd)
        _take_output(Path(order.log))
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__  # fds 1 and 2, whatever a caller replaced
        os.environ.clear()
        os.environ.update(order.env)
        sys.path[:0] = [p for p in order.path if p not in sys.path]
        name_process(order.title)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        deadline = time.monotonic() + ADOPTED_S
        while os.getppid() != supervisor:  # `nopstream task` ties its life to its parent's
            if time.monotonic() > deadline:
                print(f"{order.title}: the supervisor (pid {supervisor}) is gone", file=sys.stderr)
                raise SystemExit(1)
            time.sleep(0.001)
        from nopstream.node import process

        raise SystemExit(process.main(order.role, loaded=gc.freeze))

    lifetime.end_forked(run)
