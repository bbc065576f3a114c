"""How a child process ends with the process that started it (Linux's parent-death signal)."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
"""prctl(2), looked up when this module is imported: a lookup (dlsym) in a child forked from
a threaded process can wait forever on a lock another thread of the parent held at the fork."""


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` dies; exit at once if it died already."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
