"""The one recovery policy (`node.recovery`): its order, its count and its limit.

Its steps are recorded by a fake here: the runner, the supervisor and the operator
carry them out for real in the fault, etcd and e2e suites.
"""

from __future__ import annotations

import pytest

from nopstream.node import recovery


class Recorded:
    """Steps that record what they were asked, with a store whose run another writer moved on."""

    def __init__(self, store_run: int) -> None:
        self.store_run = store_run
        self.calls: list[str] = []

    def advance(self, run: int) -> int:
        self.calls.append(f"advance {run}")
        self.store_run = max(self.store_run, run) + 1
        return self.store_run

    def record(self, recovered: recovery.Recovery) -> None:
        self.calls.append(f"record {recovered.message} #{recovered.recoveries}")

    def stop(self, run: int) -> None:
        self.calls.append(f"stop {run}")

    def start(self, run: int) -> None:
        self.calls.append(f"start {run}")


def test_the_next_run_is_recorded_before_the_old_stops_and_the_new_starts():
    steps = Recorded(store_run=3)
    recovered = recovery.recover(steps, run=3, recoveries=1, limit=2, cause="task t exited with 1")
    assert recovered == recovery.Recovery(3, 4, 2, "task t exited with 1")
    assert steps.calls == ["advance 3", "record task t exited with 1 (run 3 -> 4) #2", "stop 3", "start 4"]
    # the store's run moved past ours meanwhile (a second supervisor): the new run is the store's
    steps = Recorded(store_run=9)
    assert recovery.recover(steps, run=3, recoveries=0, limit=2, cause="c").run == 10


def test_past_the_limit_nothing_is_advanced_or_stopped():
    steps = Recorded(store_run=3)
    with pytest.raises(recovery.TooManyRecoveries) as failed:
        recovery.recover(steps, run=3, recoveries=2, limit=2, cause="task t exited with 1")
    assert str(failed.value) == "task t exited with 1 (after 2 recoveries)"
    assert steps.calls == []
