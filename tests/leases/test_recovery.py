"""The one recovery policy (`node.recovery`): its order, its failure rate and its backoff.

Its steps are recorded by a fake here: the runner, the supervisor and the operator
carry them out for real in the fault, etcd and e2e suites.
"""

from __future__ import annotations

import pytest

from nopstream.errors import BadInput, Refusal, RestoreRefused, StartRefused
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

    def start(self, run: int, *, delay_s: float) -> None:
        self.calls.append(f"start {run} after {delay_s:g} s")


POLICY = recovery.RestartPolicy(max_failures=2, window_s=60)


def test_the_next_run_is_recorded_before_the_old_stops_and_the_new_starts():
    steps = Recorded(store_run=3)
    recovered = recovery.recover(
        steps, run=3, recoveries=1, failures=[100.0], now=101.0, policy=POLICY, cause="task t exited with 1"
    )
    assert recovered == recovery.Recovery(3, 4, 2, "task t exited with 1", (100.0, 101.0), 0.25)
    assert steps.calls == [
        "advance 3",
        "record task t exited with 1 (run 3 -> 4, after 0.25 s) #2",
        "stop 3",
        "start 4 after 0.25 s",
    ]
    # the store's run moved past ours meanwhile (a second supervisor): the new run is the store's
    steps = Recorded(store_run=9)
    assert (
        recovery.recover(steps, run=3, recoveries=0, failures=[], now=0, policy=POLICY, cause="c").run == 10
    )


def test_past_the_failure_rate_nothing_is_advanced_or_stopped():
    steps = Recorded(store_run=3)
    with pytest.raises(recovery.TooManyRecoveries) as failed:
        recovery.recover(
            steps,
            run=3,
            recoveries=7,
            failures=[50.0, 100.0],
            now=109.0,
            policy=POLICY,
            cause="task t exited with 1",
        )
    assert str(failed.value) == (
        "task t exited with 1 (3 failures within 60 s; the limit is 2, after 7 recoveries)"
    )
    assert steps.calls == []


def test_failures_older_than_the_window_do_not_count_and_the_backoff_doubles_up_to_its_bound():
    """A 6 s outage used all 10 recoveries in about 6 s, and an unbounded job died at its 11th failure."""
    steps = Recorded(store_run=1)
    failures: tuple[float, ...] = (0.0, 1.0)  # long before: outside the window
    recovered = recovery.recover(
        steps, run=1, recoveries=40, failures=failures, now=1000.0, policy=POLICY, cause="c"
    )
    assert (recovered.failures, recovered.delay_s, recovered.recoveries) == ((1000.0,), 0.0, 41)
    policy = recovery.RestartPolicy()
    assert [policy.delay(n) for n in range(1, 10)] == [0, 0.25, 0.5, 1, 2, 4, 8, 10, 10]


def test_a_runner_that_cannot_wait_in_place_waits_from_the_failure_before():
    policy = recovery.RestartPolicy(max_failures=3, window_s=60)
    assert policy.wait([], now=100.0) == 0  # the first failure within the window: at once
    assert policy.wait([100.0], now=100.1) == pytest.approx(0.15)  # the second's 0.25 s from the first
    assert policy.wait([100.0, 100.25], now=100.3) == pytest.approx(0.45)  # the third's 0.5 s
    assert policy.wait([100.0, 100.25, 100.75], now=100.8) == 0  # past the limit: it fails at once
    assert policy.wait([10.0], now=100.0) == 0  # out of the window


@pytest.mark.parametrize(
    ("refused", "code", "line"),
    [
        (RestoreRefused("manifest 7 is damaged"), 4, "nopstream task: cannot start: manifest 7 is damaged"),
        (StartRefused("table t is missing"), 5, "nopstream task: cannot start: table t is missing"),
        (
            BadInput("split a.jsonl byte 9: not JSON"),
            6,
            "nopstream task: bad input: split a.jsonl byte 9: not JSON",
        ),
    ],
)
def test_a_refusal_is_the_same_in_each_form_it_crosses_a_process_in(refused, code, line):
    """A refusal goes as a JSON body (a task's POST /failed) and as an exit code and a last line (a pod's,
    a supervisor's child): read back from either, it is the same kind with the same words."""
    refusal = Refusal.of(refused)
    assert (refusal.exit_code, refusal.line()) == (code, line)
    assert Refusal.from_json(refusal.to_json()) == refusal == Refusal.from_exit(code, line)
    again = refusal.error("task t: ")
    assert type(again) is type(refused) and str(again) == f"task t: {refused}"
    assert Refusal.from_exit(1, line) is None and Refusal.from_json({"error": "boom"}) is None
