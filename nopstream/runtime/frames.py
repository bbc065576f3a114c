"""Channel frames and their binary encoding: pure code, no I/O.

A channel carries, in order: record batches, watermarks, barriers and one
end-of-input marker; the receiver sends credits back. Binary layout (big-endian):

    BATCH      0x01 | u8 lists | u32 n | n x i64 timestamps (lists >= 1) | n x i64 marks (lists = 2)
               | codec bytes
    WATERMARK  0x02 | u8 idle | i64 timestamp
    BARRIER    0x03 | u64 epoch | u8 kind (0 checkpoint, 1 savepoint, 2 final, 3 stop)
    END        0x04   end of data: no more records; flush (barriers may still follow)
    CREDIT     0x05 | u64 units
    HELLO      0x06 | JSON {job, pipeline, run, attempt, channel}
    WELCOME    0x07
    REFUSED    0x08 | UTF-8 reason
    CLOSE      0x09   end of stream: nothing follows (after the final barrier)
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from nopstream.plan.epochs import EpochKind
from nopstream.records import Batch
from nopstream.runtime.codec import Codec

BATCH, WATERMARK, BARRIER, END, CREDIT, HELLO, WELCOME, REFUSED, CLOSE = range(1, 10)
BARRIER_KINDS = tuple(EpochKind)  # their index is the byte in a BARRIER frame


class FrameError(ValueError):
    """Bytes that are not a valid frame."""


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time has reached `timestamp` on this channel (or the channel is idle)."""

    timestamp: int
    idle: bool = False


@dataclass(frozen=True, slots=True)
class Barrier:
    """Epoch `epoch`'s cut on this channel."""

    epoch: int
    kind: EpochKind = EpochKind.CHECKPOINT


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """No more records will follow on this channel (barriers may: the final one)."""


@dataclass(frozen=True, slots=True)
class EndOfStream:
    """Nothing more follows on this channel."""


@dataclass(frozen=True, slots=True)
class Credit:
    """The receiver consumed `units` more and lets the sender send that much again."""

    units: int


@dataclass(frozen=True, slots=True)
class Hello:
    """The first frame of a channel: who is connecting, for which run."""

    job: str
    pipeline: str
    run: int
    attempt: str
    channel: str


@dataclass(frozen=True, slots=True)
class Welcome:
    """The receiver accepted the handshake; the channel's credit window (its share of the task's budget)."""

    window: int


@dataclass(frozen=True, slots=True)
class Refused:
    """The receiver refused the handshake, and why."""

    reason: str


Frame = Batch | Watermark | Barrier | EndOfInput | EndOfStream
Control = Credit | Hello | Welcome | Refused
DATA_FRAMES = (Batch, Watermark, Barrier, EndOfInput, EndOfStream)

_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_WM = struct.Struct(">Bq")
_BARRIER = struct.Struct(">QB")
_BATCH_HEAD = struct.Struct(">BI")


def encode(frame: Frame | Control, codec: Codec) -> bytes:
    """The bytes of a frame."""
    if isinstance(frame, Batch):
        if frame.timestamps is None:
            return bytes((BATCH,)) + _BATCH_HEAD.pack(0, 0) + codec.encode(frame.records)
        n = len(frame.timestamps)
        lists = frame.timestamps if frame.marks is None else frame.timestamps + frame.marks
        return b"".join(
            (
                bytes((BATCH,)),
                _BATCH_HEAD.pack(1 if frame.marks is None else 2, n),
                struct.pack(f">{len(lists)}q", *lists),
                codec.encode(frame.records),
            )
        )
    if isinstance(frame, Watermark):
        return bytes((WATERMARK,)) + _WM.pack(int(frame.idle), frame.timestamp)
    if isinstance(frame, Barrier):
        return bytes((BARRIER,)) + _BARRIER.pack(frame.epoch, BARRIER_KINDS.index(frame.kind))
    if isinstance(frame, EndOfInput):
        return bytes((END,))
    if isinstance(frame, EndOfStream):
        return bytes((CLOSE,))
    if isinstance(frame, Credit):
        return bytes((CREDIT,)) + _U64.pack(frame.units)
    if isinstance(frame, Hello):
        body = {
            "job": frame.job,
            "pipeline": frame.pipeline,
            "run": frame.run,
            "attempt": frame.attempt,
            "channel": frame.channel,
        }
        return bytes((HELLO,)) + json.dumps(body, sort_keys=True).encode()
    if isinstance(frame, Welcome):
        return bytes((WELCOME,)) + _U64.pack(frame.window)
    return bytes((REFUSED,)) + frame.reason.encode()


def decode(data: bytes, codec: Codec) -> Frame | Control:
    """A frame from its bytes; FrameError when they are not one."""
    if not data:
        raise FrameError("empty frame")
    kind = data[0]
    try:
        if kind == BATCH:
            lists, n = _BATCH_HEAD.unpack_from(data, 1)
            if lists > 2:
                raise FrameError(f"a batch frame with {lists} lists of numbers (at most 2)")
            offset = 1 + _BATCH_HEAD.size
            numbers = list(struct.unpack_from(f">{lists * n}q", data, offset))
            offset += 8 * lists * n
            timestamps = numbers[:n] if lists else None
            marks = numbers[n:] if lists == 2 else None
            return Batch(codec.decode(data[offset:]), timestamps, marks)
        if kind == WATERMARK:
            idle, ts = _WM.unpack_from(data, 1)
            return Watermark(ts, bool(idle))
        if kind == BARRIER:
            epoch, barrier_kind = _BARRIER.unpack_from(data, 1)
            return Barrier(epoch, BARRIER_KINDS[barrier_kind])
        if kind == END:
            return EndOfInput()
        if kind == CLOSE:
            return EndOfStream()
        if kind == CREDIT:
            return Credit(_U64.unpack_from(data, 1)[0])
        if kind == HELLO:
            body: dict[str, Any] = json.loads(data[1:])
            return Hello(body["job"], body["pipeline"], int(body["run"]), body["attempt"], body["channel"])
        if kind == WELCOME:
            return Welcome(_U64.unpack_from(data, 1)[0])
        if kind == REFUSED:
            return Refused(data[1:].decode())
    except (struct.error, ValueError, KeyError, IndexError) as exc:
        raise FrameError(f"bad frame of kind {kind}: {exc}") from None
    raise FrameError(f"unknown frame kind {kind}")
