"""The schedule `nopstream chaos` plans: every kill and point once, a caused restore never last, the
sink steps in the first half."""

from __future__ import annotations

import random
from collections import Counter

from nopstream.local.kills import CAUSED, FLOWING, Event, plan_events


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
