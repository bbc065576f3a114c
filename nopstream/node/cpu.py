"""How a task process asks the kernel to share a core with it: in long turns.

Linux (EEVDF, 6.6 and later) gives a CPU-bound process turns of its base slice, about
1.4 ms on a 2-core machine, when more such processes than cores are runnable. A task
process's working set (its interpreter, its state, its buffers) does not survive the
other processes' turns in the CPU caches, so every turn starts cold: measured with
`bench/throughput.py`'s word count at parallelism 4 on 2 cores, the same per-word work
took 50-80 % more CPU than at parallelism 2. Since 6.12 a process may ask for a longer
slice through `sched_setattr` (`sched_runtime` of a SCHED_OTHER task); Python has no
binding for it, so the call goes through ctypes. Older kernels ignore the request for
SCHED_OTHER tasks; other systems and architectures are left as they are.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys

log = logging.getLogger(__name__)

TASK_SLICE_MS = 20.0
"""The turn a task process asks for: far longer than a cold start of its caches, short
against an epoch's interval (a barrier waits at most this for a busy core)."""

_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}  # the syscall's number (asm-generic: 274)
_SCHED_OTHER = 0


class _SchedAttr(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


def ask_for_long_turns(slice_ms: float = TASK_SLICE_MS) -> bool:
    """Ask the kernel for CPU turns of `slice_ms` for this process (keeping its nice value);
    whether the request was taken (False where there is no such call: nothing changes)."""
    number = _SCHED_SETATTR.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return False
    attr = _SchedAttr(
        size=ctypes.sizeof(_SchedAttr),
        sched_policy=_SCHED_OTHER,
        sched_nice=os.getpriority(os.PRIO_PROCESS, 0),
        sched_runtime=int(slice_ms * 1_000_000),
    )
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 0, ctypes.byref(attr), 0) != 0:
        log.info("CPU turns of %s ms not taken: %s", slice_ms, os.strerror(ctypes.get_errno()))
        return False
    return True
