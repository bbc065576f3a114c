"""Barrier alignment as pure logic (`runtime.alignment`): any number of inputs, ended ones ignored."""

from __future__ import annotations

import pytest

from nopstream.plan.epochs import EpochKind
from nopstream.runtime.alignment import Alignment, AlignmentError
from nopstream.runtime.frames import Barrier


def test_a_barrier_is_aligned_once_every_open_channel_delivered_it():
    a = Alignment()
    open_channels = {"x", "y", "z"}
    assert a.complete(open_channels) is None and not a.waiting(open_channels)
    a.arrive("y", Barrier(4), now=10.0)
    assert a.waiting(open_channels) and a.complete(open_channels) is None
    a.arrive("x", Barrier(4), now=11.0)
    assert a.complete(open_channels) is None
    a.arrive("z", Barrier(4), now=12.0)
    assert not a.waiting(open_channels)
    assert a.complete(open_channels) == Barrier(4) and a.started == 10.0
    assert a.barrier is None and a.arrived == set()  # the next epoch starts afresh
    a.arrive("z", Barrier(5, EpochKind.FINAL), now=13.0)
    assert a.barrier == Barrier(5, EpochKind.FINAL) and a.arrived == {"z"}


def test_a_channel_that_ended_its_stream_does_not_hold_alignment_back():
    a = Alignment()
    a.arrive("x", Barrier(2), now=0.0)
    assert a.complete({"x", "y"}) is None
    assert a.complete({"x"}) == Barrier(2)  # y closed meanwhile


def test_a_barrier_of_another_epoch_while_aligning_is_refused():
    a = Alignment()
    a.arrive("x", Barrier(2), now=0.0)
    with pytest.raises(AlignmentError, match=r"^barrier 3 on y while aligning barrier 2$"):
        a.arrive("y", Barrier(3), now=1.0)
