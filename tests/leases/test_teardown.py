"""A task process whose work is committed ends, even when its teardown hangs.

After the final commit, what is left (closing clients, the lease keeper's thread)
must not keep the process, and with it its pod and its job, alive. The hang here is
made on purpose (a coroutine sleeps where the teardown would run): no real client
hangs on demand, and the rule is the same whatever the client.
"""

from __future__ import annotations

import subprocess
import sys
import time

from nopstream import stacks

HANG = """
import asyncio
from nopstream.node import task
task.TEARDOWN_S = 1.0

async def teardown():
    task._exit_if_teardown_hangs("wc/main/count/1")
    await asyncio.sleep(60)  # a teardown that never ends

asyncio.run(teardown())
"""


def test_a_teardown_that_hangs_after_the_final_commit_ends_the_process_with_0_saying_where():
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HANG], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 20  # the timer, not the sleep, ended it
    assert "task wc/main/count/1: teardown not done 1s after the final commit: exiting" in done.stderr
    assert (
        f"{stacks.MARK} " in done.stderr
        and "  task Task-1: tasks.py:" in done.stderr
        and " sleep <- <string>:8 teardown" in done.stderr
    )
