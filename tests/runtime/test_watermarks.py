"""Watermark generation at sources and combination over input channels."""

from __future__ import annotations

from nopstream.records import MAX_TIMESTAMP, MIN_TIMESTAMP
from nopstream.runtime.watermarks import InputWatermarks, WatermarkGenerator


def test_combined_watermark_is_the_minimum_over_active_channels():
    wm = InputWatermarks(["a", "b", "c"])
    assert wm.update("a", 100) is None  # b and c still at the minimum
    assert wm.update("b", 50) is None
    assert wm.update("c", 70) == 50
    assert wm.update("b", 200) == 70
    assert wm.update("c", 10, idle=True) == 100  # an idle channel does not hold event time back
    assert wm.update("a", 90) is None  # watermarks never go back
    assert wm.end("b") is None
    assert wm.update("a", 300) == 300
    wm.activity("c")  # records on c: active again, at its last mark
    assert wm.current == 300 and wm.marks["c"] == 70
    assert wm.end("a") is None and wm.end("c") == MAX_TIMESTAMP
    restored = InputWatermarks(["a", "b", "c"])
    restored.restore(wm.snapshot())
    assert restored.snapshot() == wm.snapshot()


def test_bounded_out_of_orderness_and_idleness():
    now = [0]
    gen = WatermarkGenerator({"maxOutOfOrdernessMs": 30, "idleTimeoutMs": 500}, lambda: now[0])
    assert gen.due() is None
    gen.observe([100, 80, 120])
    assert gen.due() == (89, False)  # 120 - 30 - 1: a record at 90 is not late yet
    assert gen.due() is None
    gen.observe([110])  # late relative to the max: the watermark stays
    assert gen.due() is None
    now[0] = 499
    assert gen.due() is None
    now[0] = 500
    assert gen.due() == (89, True)
    gen.observe([200])
    assert gen.due() == (169, False) and not gen.idle
    other = WatermarkGenerator({}, lambda: 0)
    other.restore(gen.snapshot())
    assert other.snapshot() == {"maxSeen": 200, "emitted": 169}
    assert MIN_TIMESTAMP < 0


def test_a_record_of_the_same_millisecond_as_the_highest_is_not_late():
    """A watermark W says no record at or before W is still to come: with no out-of-orderness, a
    second record stamped like the first is not late (it was, and joins and CEP dropped it)."""
    gen = WatermarkGenerator({}, lambda: 0)
    marks = gen.observe([100, 100, 100, 101])
    assert marks == [MIN_TIMESTAMP, 99, 99, 99]
    assert all(ts > mark for ts, mark in zip([100, 100, 100, 101], marks, strict=True))
    assert gen.due() == (100, False)
