"""The operator contract and the context the task gives each operator.

An operator is a small class with explicit callbacks, all batch at a time:
`on_batch` (records in, records out), `on_watermark` (event time advanced: fire
timers and windows), `on_end` (end of input: flush), `snapshot` and `restore`
(plain data with a schema version). Side outputs go through `Context.side`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from nopstream.errors import error_text, user_frame
from nopstream.plan.nodes import DEAD_LETTER
from nopstream.plan.partitioned import ShardRange
from nopstream.plan.streamgraph import KeySelector, StreamNode
from nopstream.records import MIN_TIMESTAMP, Batch, ConnectorFactory
from nopstream.runtime.keyed import KeyedState, KeyFn, ShardCache, key_function

STATE_SCHEMA_VERSION = 1


@dataclass
class Context:
    """What an operator may know and use: its identity, shards, clock and side outputs."""

    node: StreamNode
    subtask: int
    parallelism: int
    shards: ShardRange | None
    shard_cache: ShardCache
    side: Callable[[str, Batch], None]
    clock: Callable[[], int]
    keyed_state: KeyedState | None = field(default=None)
    connectors: ConnectorFactory | None = None  # a lookup's client comes from them

    def keyed(self) -> KeyedState:
        """The operator's keyed state (created on first use; keyed vertices only)."""
        if self.keyed_state is None:
            if self.shards is None:
                raise RuntimeError(f"operator '{self.node.node_id}' is keyed but its vertex owns no shards")
            self.keyed_state = KeyedState(self.shards, self.shard_cache)
        return self.keyed_state

    def key_fns(self) -> list[KeyFn]:
        """Each input's key function: its own of `keys`, or the operator's one key for every input."""
        keys = self.node.spec.get("keys")
        if keys:
            return [key_function(KeySelector(k.get("field"), k.get("fn"))) for k in keys]
        return [key_function(self.node.key)] * len(self.node.spec["inputs"])  # type: ignore[arg-type]


class DeadLetters:
    """Where an operator sets aside a record its function or key selector fails on (`onError:
    dead-letter`): its side output `deadLetterOutput` gets the record with what went wrong.
    Under `onError: fail` (the default) the error is raised: the chain names the operator."""

    def __init__(self, node: StreamNode, side: Callable[[str, Batch], None]) -> None:
        """Read `node`'s `onError` and `deadLetterOutput`; set records aside through `side(tag, batch)`."""
        spec = node.spec
        self.on = spec.get("onError") == "dead-letter"
        self.tag = spec.get("deadLetterOutput") or DEAD_LETTER
        self.node_id = node.node_id
        self.side = side

    def put(self, record: Any, exc: Exception, ts: int | None = None, mark: int | None = None) -> None:
        """Set `record` aside (with its timestamp and mark) as `exc` went wrong on it; raise `exc` unless
        the operator dead-letters."""
        if not self.on:
            raise exc
        self.letter(dead_letter(self.node_id, error_text(exc), user_frame(exc), record), ts, mark)

    def letter(self, letter: dict[str, Any], ts: int | None, mark: int | None) -> None:
        """Send a dead letter on (with the timestamp and mark of the record it stands for)."""
        stamps = None if ts is None else [ts]
        self.side(self.tag, Batch([letter], stamps, None if stamps is None or mark is None else [mark]))

    def at(self, batch: Batch, i: int, exc: Exception) -> None:
        """`put` record `i` of `batch` with its timestamp and mark."""
        stamps, marks = batch.timestamps, batch.marks
        self.put(
            batch.records[i], exc, None if stamps is None else stamps[i], None if marks is None else marks[i]
        )

    def guard(self, batch: Batch, whole: Callable[[], Batch], one: Callable[[Any], list[Any]]) -> Batch:
        """`whole()` (the batch's output at once); when it fails and the operator dead-letters, the
        batch again record by record: `one(record)` is what a record makes, a record it fails on makes
        nothing and is set aside (`put`)."""
        try:
            return whole()
        except Exception:
            if not self.on:
                raise
        made: list[list[Any]] = []
        for i, record in enumerate(batch.records):
            try:
                made.append(one(record))
            except Exception as exc:
                self.at(batch, i, exc)
                made.append([])
        return batch.spread(made)


def dead_letter(operator_id: str, error: str, at: str | None, record: Any) -> dict[str, Any]:
    """The record an operator (or source) sets aside: the record, what went wrong and the user's frame."""
    return {"operator": operator_id, "error": error, "at": at, "record": record}


class Operator(Protocol):
    """One operator of a chain."""

    watermark_delay: int
    """How far the watermark the operator passes on stays behind the one it got (ms): an operator that
    emits records behind its watermark (an outer interval join) holds it back, as Flink does."""

    def on_batch(self, batch: Batch, input_index: int) -> Batch:
        """Process a batch; return the main output (possibly empty)."""
        ...

    def on_watermark(self, watermark: int) -> Batch | None:
        """Event time reached `watermark`: fire what is due."""
        ...

    def on_processing_time(self, now: int) -> Batch | None:
        """The wall clock reached `now` (ms): fire processing-time timers and windows."""
        ...

    def on_end(self) -> Batch | None:
        """No more input: flush what is held."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The operator's state as plain data (`schemaVersion`, `keyed`, `operator`)."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Load a snapshot made by `snapshot`."""
        ...

    def timers(self) -> int:
        """How many timers are set (what a restore rebuilt, in a restore report)."""
        ...


class StatelessOperator:
    """Base of operators without state: no watermark or end behaviour, empty snapshots."""

    watermark_delay = 0

    def on_watermark(self, watermark: int) -> Batch | None:
        """Nothing to fire."""
        return None

    def on_processing_time(self, now: int) -> Batch | None:
        """Nothing to fire."""
        return None

    def on_end(self) -> Batch | None:
        """Nothing held."""
        return None

    def snapshot(self) -> dict[str, Any]:
        """No state."""
        return {"schemaVersion": STATE_SCHEMA_VERSION}

    def restore(self, state: dict[str, Any]) -> None:
        """No state to load."""

    def timers(self) -> int:
        """No timers."""
        return 0


class KeyedOperator:
    """Base of keyed operators: state in `ctx.keyed()`, snapshots shard by shard."""

    ctx: Context
    watermark: int = MIN_TIMESTAMP
    watermark_delay = 0

    def on_watermark(self, watermark: int) -> Batch | None:
        """Nothing waits for event time unless the operator says so."""
        return None

    def on_processing_time(self, now: int) -> Batch | None:
        """Nothing waits for processing time unless the operator says so."""
        return None

    def snapshot(self) -> dict[str, Any]:
        """Keyed state by shard, plus `operator_state()`."""
        return {
            "schemaVersion": STATE_SCHEMA_VERSION,
            "keyed": self.ctx.keyed().snapshot(),
            "operator": self.operator_state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Load the owned shards and the operator state."""
        self.ctx.keyed().restore(state.get("keyed", {}))
        self.restore_operator_state(state.get("operator", {}))

    def operator_state(self) -> dict[str, Any]:
        """Non-keyed state of the operator: its watermark (lateness and timers are judged by it)."""
        return {"watermark": self.watermark}

    def restore_operator_state(self, state: dict[str, Any]) -> None:
        """Load what `operator_state` returned, then rebuild the timers from the keyed state."""
        self.watermark = int(state.get("watermark", MIN_TIMESTAMP))
        self.rebuild_timers()

    def rebuild_timers(self) -> None:
        """Derive in-memory timer queues from restored keyed state (none by default)."""

    def timers(self) -> int:
        """How many timers are set (none by default)."""
        return 0


def empty_like(batch: Batch) -> Batch:
    """An empty batch with timestamps (and marks) when `batch` has them."""
    return batch.cut(0, 0)
