"""Local pre-aggregation: a combiner before the shuffle into a final aggregate, reduce or window.

An upstream subtask whose HASH edge leads into an `aggregate` or `reduce` with
`emit: final`, or into an event-time tumbling or sliding `window` aggregate without
lateness (and `combine` not false), folds the records it would send into one partial
accumulator per key (per key and window), and sends `[key, accumulator]` (`[key,
start, end, accumulator]`) instead: at every barrier before the barrier goes out (so
a snapshot holds no partial state and each epoch's partials travel inside it), at
end of data, before an idle watermark, whenever it holds `limit` entries, and, for
windows, before it forwards a watermark that closes them (a window fires downstream
only once every upstream's watermark passed it, so every partial of it is there
first). The downstream operator merges them (`merge_partials`). A record late for a
window by its mark (`Batch.marks`) is left out of that window's partial here, as the
window would have left it out.

A final result is emitted once per key, and a window without lateness fires once,
so neither can tell the difference; rolling results, windows that fire again for
late records, late side outputs, window functions (they see the records), sessions
and processing-time windows would, and are never combined. A `reduce` fn is applied
to partially reduced values: it must be associative, as Flink's combinable reduce
functions are.

Both ends decide from the plan alone (`combined_edges`), so they always agree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

from nopstream.plan.partitioned import Edge, PartitionedPlan
from nopstream.plan.streamgraph import EdgePolicy, StreamNode
from nopstream.records import MIN_TIMESTAMP, Batch, late_reference
from nopstream.runtime.functions import resolve
from nopstream.runtime.keyed import batch_keys, key_function
from nopstream.runtime.operators.aggregates import aggregator, is_count
from nopstream.runtime.operators.windows import assign


def combines(edge: Edge, target: StreamNode) -> bool:
    """Whether `edge`'s upstream pre-aggregates for `target`, the operator at its end."""
    spec = target.spec
    if edge.policy is not EdgePolicy.HASH or edge.key is None or edge.key != target.key:
        return False
    if spec.get("combine", True) is False or spec.get("onError") == "dead-letter":
        return False  # (a record the operator sets aside must reach it whole)
    if target.type == "reduce":
        return spec.get("emit") == "final"
    if target.type == "aggregate":
        return spec.get("emit") == "final" and _mergeable(spec["aggregate"])
    return target.type == "window" and _combinable_window(spec)


def _combinable_window(spec: dict[str, Any]) -> bool:
    window = spec["window"]
    return (
        "aggregate" in spec
        and _mergeable(spec["aggregate"])
        and window.get("time") == "event"
        and window["kind"] in ("tumbling", "sliding")
        and not window.get("allowedLatenessMs")
        and window.get("lateOutput") is None
    )


def _mergeable(aggregate: dict[str, Any]) -> bool:
    """Whether an aggregate's accumulators can be merged (a user aggregate may lack `merge`)."""
    return callable(getattr(aggregator(aggregate), "merge", None))


def combined_edges(plan: PartitionedPlan) -> frozenset[str]:
    """The ids of the edges of `plan` whose records travel as partial accumulators."""
    operators = plan.operators()
    return frozenset(e.edge_id for e in plan.edges if combines(e, operators[e.target_operator]))


class Drained(NamedTuple):
    """Partials handed over by a combiner: the records to send and, in the same order, their keys."""

    keys: list[Any]
    records: list[list[Any]]


class Combiner:
    """The partial accumulators of one upstream subtask's HASH edge into a final aggregate or reduce."""

    def __init__(self, edge: Edge, target: StreamNode, *, limit: int) -> None:
        """Fold by `edge`'s key the way `target` does; `full` once `limit` keys are held."""
        assert edge.key is not None
        self.key_fn = key_function(edge.key)
        self.keys_of = batch_keys(edge.key)
        self.limit = limit
        self._fold: Callable[[Any, Any], Any]
        self._first: Callable[[Any], Any]
        self._count = False
        if target.type == "aggregate":
            agg = aggregator(target.spec["aggregate"])
            self._count = is_count(agg)
            self._fold = lambda acc, record: agg.add(acc, record)
            self._first = lambda record: agg.add(agg.create(), record)
        else:
            fn = resolve(target.spec["fn"])
            self._fold = fn
            self._first = lambda record: record
        self.partials: dict[Any, Any] = self._fresh()

    def _fresh(self) -> dict[Any, Any]:
        # a count's partials are a Counter: `update` counts a whole batch in one C loop
        return Counter() if self._count else {}

    @property
    def full(self) -> bool:
        """Whether it holds its limit of keys (then it must be drained)."""
        return len(self.partials) >= self.limit

    def add(self, batch: Batch) -> None:
        """Fold a batch of records into the partial accumulators."""
        partials, key_fn = self.partials, self.key_fn
        if isinstance(partials, Counter):
            partials.update(self.keys_of(batch.records))
            return
        fold, first = self._fold, self._first
        for r in batch.records:
            k = key_fn(r)
            partials[k] = fold(partials[k], r) if k in partials else first(r)

    def drain(self) -> Drained:
        """Every partial as `[key, accumulator]`, handed over; the combiner is empty after."""
        partials, self.partials = self.partials, self._fresh()
        return Drained(list(partials), list(map(list, partials.items())))

    def drain_closed(self, watermark: int) -> Drained:
        """Nothing: a final result does not wait for event time."""
        return Drained([], [])


class WindowCombiner:
    """The partial accumulators per key and window of one upstream subtask's HASH edge into a window."""

    def __init__(self, edge: Edge, target: StreamNode, *, limit: int) -> None:
        """Assign records to `target`'s windows and fold them with its aggregate; `full` at `limit`."""
        assert edge.key is not None
        w = target.spec["window"]
        self.key_fn = key_function(edge.key)
        self.limit = limit
        self.agg = aggregator(target.spec["aggregate"])
        self.windows = (w["kind"], int(w.get("sizeMs") or 0), int(w.get("slideMs") or 0), 0)
        self.partials: dict[tuple[Any, int, int], Any] = {}
        self._ends: dict[int, list[tuple[Any, int, int]]] = {}  # window end -> its entries

    @property
    def full(self) -> bool:
        """Whether it holds its limit of (key, window) entries."""
        return len(self.partials) >= self.limit

    def add(self, batch: Batch) -> None:
        """Fold a batch of timestamped records into their windows' partial accumulators."""
        if batch.timestamps is None:
            raise RuntimeError("an event-time window's combiner got records without timestamps")
        partials, key_fn, agg, (kind, size, slide, gap) = self.partials, self.key_fn, self.agg, self.windows
        marks = batch.marks
        for i, (r, ts) in enumerate(zip(batch.records, batch.timestamps, strict=True)):
            k = key_fn(r)
            mark = late_reference(marks, i, MIN_TIMESTAMP)
            for start, end in assign(kind, size, slide, gap, ts):
                if end - 1 <= mark:  # late for this window by the record's mark, as the window judges
                    continue
                entry = (k, start, end)
                if entry in partials:
                    partials[entry] = agg.add(partials[entry], r)
                else:
                    partials[entry] = agg.add(agg.create(), r)
                    self._ends.setdefault(end, []).append(entry)

    def drain(self) -> Drained:
        """Every partial as `[key, start, end, accumulator]`; the combiner is empty after."""
        partials, self.partials, self._ends = self.partials, {}, {}
        return Drained([k for k, _, _ in partials], [[*entry, acc] for entry, acc in partials.items()])

    def drain_closed(self, watermark: int) -> Drained:
        """The partials of the windows `watermark` closes (it fires them downstream), handed over."""
        drained = Drained([], [])
        for end in [e for e in self._ends if e - 1 <= watermark]:
            for entry in self._ends.pop(end):
                drained.keys.append(entry[0])
                drained.records.append([*entry, self.partials.pop(entry)])
        return drained


AnyCombiner = Combiner | WindowCombiner


def combiner_for(edge: Edge, target: StreamNode, *, limit: int) -> AnyCombiner:
    """The combiner of a combined edge (`combines`) into `target`."""
    if target.type == "window":
        return WindowCombiner(edge, target, limit=limit)
    return Combiner(edge, target, limit=limit)
