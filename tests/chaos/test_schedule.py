"""The schedule `nopstream chaos` plans: every kill and point once, a caused restore never last, the
sink steps in the first half; a savepoint a recovery dropped asked for again."""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from types import SimpleNamespace

from nopstream import faults
from nopstream.local.kills import CAUSED, FLOWING, SAVEPOINT_LOST, Event, Schedule, plan_events


def test_every_event_once_a_caused_restore_never_last_and_the_sink_steps_early():
    points = {"after-stage", "before-publish", "mid-commit", "during-alignment", *CAUSED}
    lasts: Counter[str] = Counter()
    firsts: Counter[str] = Counter()
    for seed in range(300):
        events = plan_events(random.Random(seed), 2, points, 0.25)
        assert sorted(e.point for e in events if e.point) == sorted(points)
        assert sum(e.point is None for e in events) == 2
        lasts[str(events[-1])] += 1
        firsts[str(events[0])] += 1
        flowing = [i for i, e in enumerate(events) if e.point in FLOWING]
        assert max(flowing) < (len(events) + 1) // 2, [str(e) for e in events]
    assert not {p for p in lasts if p in CAUSED}
    assert {str(Event()), *FLOWING} <= set(firsts)  # kills and sink steps still come first by chance
    assert set(lasts) == {"kill", "kill at once", "during-alignment"}  # the rest, by chance


def test_a_savepoint_a_recovery_dropped_is_asked_for_again(tmp_path, monkeypatch):
    """`during-savepoint` asks the job for a savepoint; when SAVEPOINT_LOST epochs became durable after it
    was taken, none of them it (a recovery dropped it, as a CI run's CDC cell did), it asks again, and
    the point reached then counts as hit. The job here is the progress and the savepoint answers a
    test gives (epochs going by, the second savepoint reaching the point through `faults.reached`)."""
    monkeypatch.setenv(faults.DIR_ENV, str(tmp_path))
    calls = itertools.count()
    asked: list[int] = []
    progress = SimpleNamespace(durable=lambda: next(calls) // 4, interval=0.0)

    def savepoint() -> bool:
        asked.append(progress.durable())
        if len(asked) == 2:  # the second is taken through to its manifest
            faults.reached("during-savepoint", lambda: None)
        return True

    running = SimpleNamespace(poll=lambda: None)
    schedule = Schedule(
        [Event("during-savepoint")],
        random.Random(0),
        progress,  # type: ignore[arg-type]
        tmp_path,
        first_kill=(0.0, 0.0),
        between_kills=(0.0, 0.0),
        fault_wait=3.0,
        savepoint=savepoint,
        deadline=time.monotonic() + 10,
    )
    schedule.drive(running)  # type: ignore[arg-type]
    assert schedule.reached.hit == ["during-savepoint"] and not schedule.reached.missed
    assert len(asked) == 2 and asked[1] >= asked[0] + SAVEPOINT_LOST
