"""Frame encoding is pure and exact: every frame round-trips; bad bytes are refused."""

from __future__ import annotations

import pytest

from nopstream.records import Batch
from nopstream.runtime.codec import CODECS
from nopstream.runtime.frames import (
    Barrier,
    Credit,
    EndOfInput,
    EndOfStream,
    FrameError,
    Hello,
    Refused,
    Watermark,
    Welcome,
    decode,
    encode,
)

FRAMES = [
    Batch([1, "two", {"three": [3.0, None, True]}]),
    Batch([{"k": "a"}, {"k": "b"}], [-5, 2**62]),
    Batch([]),
    Watermark(-(2**63)),
    Watermark(1234, idle=True),
    Barrier(7),
    Barrier(2**40, "savepoint"),
    Barrier(9, "final"),
    EndOfInput(),
    EndOfStream(),
    Credit(1 << 33),
    Hello("job", "main", 3, "r3-a1", "a->b/0/1/0"),
    Welcome(4 << 20),
    Refused("stale run 1 of attempt x: the current run is 2"),
]


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: type(f).__name__)
def test_round_trip(codec, frame):
    assert decode(encode(frame, CODECS[codec]), CODECS[codec]) == frame


@pytest.mark.parametrize("data", [b"", b"\x0a", b"\x02\x00", b"\x03abc", b"\x01\x01\x00\x00\x00\x05"])
def test_bad_bytes_are_refused(data):
    with pytest.raises(FrameError):
        decode(data, CODECS["orjson"])
