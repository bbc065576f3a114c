"""A task process whose work is committed ends, even when its teardown hangs.

After the final commit, what is left (closing clients, the lease keeper's thread)
must not keep the process, and with it its pod and its job, alive. The hang here is
made on purpose (the main thread sleeps where the teardown would run): no real client
hangs on demand, and the rule is the same whatever the client.
"""

from __future__ import annotations

import subprocess
import sys
import time

from nopstream import stacks

HANG = """
import time
from nopstream.node import task
task.TEARDOWN_S = 1.0
task._exit_if_teardown_hangs("wc/main/count/1")
time.sleep(60)  # a teardown that never ends
"""


def test_a_teardown_that_hangs_after_the_final_commit_ends_the_process_with_0_saying_where():
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HANG], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 20  # the timer, not the sleep, ended it
    assert "task wc/main/count/1: teardown not done 1s after the final commit: exiting" in done.stderr
    assert f"{stacks.MARK} " in done.stderr and "thread MainThread: <string>:6 <module>" in done.stderr
