"""A network and mount namespace of the test suite's own, where the one-node cluster lives.

A holder process (`unshare --net --mount`, then `sleep`) keeps the namespaces alive;
every cluster process runs in them through `nsenter`, so the node's bridge, pod and
Service addresses, iptables chains and mounts exist only there. Inside, tmpfs covers
/run, /var/lib and /var/log, so what containerd, the kubelet and the CNI plugins write
to their fixed paths stays inside too. Nothing is set up through a name under
/run/netns: the namespaces end with their last process, and their mounts and chains
with them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from e2e import servers
from nopstream.local.children import Child

CLONE_NEWNET = 0x40000000
# Cover these with tmpfs inside: the fixed paths where containerd, runc, the kubelet,
# iptables and the CNI plugins keep state.
PRIVATE_DIRS = ("/run", "/var/lib", "/var/log")
# Kernel-wide tunables the kubelet sets at start (vm.overcommit_memory, kernel.panic, ...):
# inside, each is a file of our own bound over it, so the kubelet's writes change nothing
# outside.
KERNEL_TUNABLES = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")


def enter_net(holder_pid: int) -> None:
    """Move the calling (single-threaded) process into the network namespace of `holder_pid`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{holder_pid}/ns/net", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the network namespace of {holder_pid}: {os.strerror(err)}")
    finally:
        os.close(fd)


def kill_until_gone(find: Callable[[], Iterable[int]], deadline: float) -> list[int]:
    """SIGKILL what `find` lists until it lists nothing or `deadline` passes; what was left."""
    while (left := list(find())) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return left


def ns_inode(pid: int, kind: str) -> int | None:
    """The inode of process `pid`'s namespace `kind` (net, mnt), or None if it is gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


@dataclass
class Namespace:
    """The holder of a network + mount namespace, and how to run commands inside it."""

    holder: Child

    @classmethod
    def create(cls, workdir: Path) -> Namespace:
        """Create the namespaces, bring up loopback and cover the private paths with tmpfs."""
        workdir.mkdir(parents=True, exist_ok=True)
        holder = servers.spawn(
            "netns-holder",
            ["unshare", "--net", "--mount", "--propagation", "private", "--", "sleep", "infinity"],
            log=workdir / "holder.log",
        )
        ns = cls(holder)
        try:
            servers.wait_until("the namespaces", ns._entered, process=holder, timeout=10)
            ns.run("ip", "link", "set", "lo", "up")
            for path in PRIVATE_DIRS:
                ns.run("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", path)
            tunables = workdir / "kernel-tunables"
            tunables.mkdir(exist_ok=True)
            for name in KERNEL_TUNABLES:
                own = tunables / name.replace("/", ".")
                own.write_text(Path("/proc/sys", name).read_text())
                ns.run("mount", "--bind", str(own), f"/proc/sys/{name}")
        except BaseException:
            ns.stop()
            raise
        return ns

    def _entered(self) -> bool:
        own = ns_inode(os.getpid(), "net")
        inside = ns_inode(self.holder.pid, "net")
        return inside is not None and inside != own

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside both namespaces (nsenter execs it: the PID stays the command's)."""
        return ["nsenter", f"--target={self.holder.pid}", "--net", "--mount", "--", *argv]

    def run(self, *argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a command inside and wait for it."""
        done = subprocess.run(self.wrap(list(argv)), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise servers.ServerError(f"{' '.join(argv)} (in the test namespace): {done.stderr.strip()}")
        return done

    def spawn(self, name: str, argv: list[str], *, log: Path, env: dict[str, str] | None = None) -> Child:
        """Start a long-running server inside, like `servers.spawn`."""
        return servers.spawn(name, self.wrap(argv), log=log, env=env)

    def members(self) -> list[int]:
        """PIDs of every process in either namespace but the holder (servers, shims, forwarders)."""
        net, mnt = ns_inode(self.holder.pid, "net"), ns_inode(self.holder.pid, "mnt")
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.holder.pid:
                continue
            pid = int(entry)
            if (net is not None and ns_inode(pid, "net") == net) or (
                mnt is not None and ns_inode(pid, "mnt") == mnt
            ):
                found.append(pid)
        return found

    def stop(self, timeout: float = 20.0) -> None:
        """SIGKILL every process left inside, then the holder: the namespaces end with them."""
        left = kill_until_gone(self.members, time.monotonic() + timeout)
        self.holder.stop(grace=2)
        if left:
            raise servers.ServerError(f"processes still in the test namespace after {timeout}s: {left}")
