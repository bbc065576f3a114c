"""What a test cluster must not leave on this machine once stopped: mounts, links, iptables
rules, cgroups, processes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def machine_state() -> dict[str, object]:
    """The mounts, the number of links and iptables rules, and the cgroups of this machine now."""
    cgroups = sorted(
        str(p) for c in Path("/sys/fs/cgroup").iterdir() if c.is_dir() for p in c.iterdir() if p.is_dir()
    )
    return {
        "mounts": sorted(
            line.split(" ", 4)[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
        ),
        "links": subprocess.run(
            ["ip", "-o", "link"], capture_output=True, text=True, check=True
        ).stdout.count("\n"),
        "iptables": subprocess.run(
            ["iptables-save"], capture_output=True, text=True, check=True
        ).stdout.count("-A "),
        "cgroups": cgroups,
    }


def left_behind(before: dict[str, object], workdir: Path, pids: list[int]) -> list[str]:
    """What differs from `before`, each process whose command line names `workdir`, and each of
    `pids` still running: empty when the cluster left this machine as it was."""
    after = machine_state()
    found = [f"{key}: {before[key]!r} -> {after[key]!r}" for key in before if before[key] != after[key]]
    found += [f"process {pid} still runs" for pid in pids if os.path.exists(f"/proc/{pid}/ns/net")]
    for entry in os.listdir("/proc"):
        if entry.isdigit() and str(workdir) in (cmdline := _cmdline(int(entry))):
            found.append(f"process {entry} of the cluster: {cmdline[:200]}")
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
