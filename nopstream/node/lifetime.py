"""How a child process ends with the process that started it (Linux's parent-death signal), and how a
forked child ends at all (`end_forked`)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
"""prctl(2), looked up when this module is imported: a lookup (dlsym) in a child forked from
a threaded process can wait forever on a lock another thread of the parent held at the fork."""


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` dies; exit at once if it died already."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def end_forked(body: Callable[[], object]) -> NoReturn:
    """Run `body` in a forked child, then end the child: 0 when it returns, a SystemExit's code, 1
    after printing anything else it raised; never back into the code the parent forked from."""
    code = 1
    try:
        body()
        code = 0
    except SystemExit as leaving:
        code = leaving.code if isinstance(leaving.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
