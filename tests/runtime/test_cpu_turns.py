"""Task processes ask the kernel for long CPU turns (`node.cpu`); the runner keeps its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from nopstream.node import cpu
from tests.conftest import ROOT


def kernel_slice(pid: int | str) -> int:
    """The CPU turn the kernel gives a process, in ns (Linux's /proc/PID/sched)."""
    found = re.search(r"^se\.slice\s*:\s*(\d+)", Path(f"/proc/{pid}/sched").read_text(), re.M)
    assert found is not None, f"/proc/{pid}/sched has no se.slice"
    return int(found.group(1))


def turns_taken_here() -> bool:
    """Whether this kernel takes a slice request (a child asks, so this process keeps its own)."""
    probe = subprocess.run(
        [sys.executable, "-c", "from nopstream.node import cpu; print(cpu.ask_for_long_turns())"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    return probe.stdout.strip() == "True"


def test_the_task_processes_of_a_run_take_long_turns_and_the_runner_does_not(tmp_path):
    job = {
        "jobId": "turns",
        "parallelism": 2,
        "model": {
            "sources": [{"id": "src", "type": "generator", "config": {"count": 400, "ratePerSecond": 100}}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    runner = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", "--quiet"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        children: list[str] = []
        deadline = time.monotonic() + 30
        while len(children) < 2 and time.monotonic() < deadline:  # src -> out, chained, x2
            children = Path(f"/proc/{runner.pid}/task/{runner.pid}/children").read_text().split()
            time.sleep(0.05)
        assert len(children) == 2, children
        slices = {kernel_slice(pid) for pid in children}
        default = kernel_slice(runner.pid)
        if turns_taken_here():
            assert slices == {int(cpu.TASK_SLICE_MS * 1_000_000)}
            assert default != int(cpu.TASK_SLICE_MS * 1_000_000)
        else:  # a kernel without slice requests (before 6.12): nothing changes
            assert slices == {default}
        assert runner.wait(60) == 0
    finally:
        runner.kill()
        runner.wait()
