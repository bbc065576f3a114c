"""The schedule `nopstream chaos` plans: every kill and point once, a caused restore never last."""

from __future__ import annotations

import random
from collections import Counter

from nopstream.local.kills import CAUSED, plan_events


def test_every_event_once_and_a_caused_restore_never_last():
    points = {"after-stage", "before-publish", "mid-commit", "during-alignment", *CAUSED}
    lasts: Counter[str] = Counter()
    for seed in range(300):
        events = plan_events(random.Random(seed), 2, points, 0.25)
        assert sorted(e.point for e in events if e.point) == sorted(points)
        assert sum(e.point is None for e in events) == 2
        lasts[str(events[-1])] += 1
    assert not {p for p in lasts if p in CAUSED}
    assert len(lasts) >= 4  # the rest still come last by chance (kills and each other point)
