"""Local pre-aggregation: a combiner before the shuffle into a final aggregate or reduce.

An upstream subtask whose HASH edge leads into an `aggregate` or `reduce` with
`emit: final` (and `combine` not false) folds the records it would send into one
partial accumulator per key, and sends `[key, accumulator]` pairs instead: at every
barrier before the barrier goes out (so a snapshot holds no partial state and each
epoch's partials travel inside it), at end of data, and whenever it holds `limit`
keys. The downstream operator merges the pairs (`merge_partials`). A final result is
emitted once per key at end of input, so it cannot tell the difference; rolling
results would (one update per partial instead of per record), so they are never
combined. A `reduce` fn is then applied to partially reduced values: it must be
associative, as Flink's combinable reduce functions are.

Both ends decide from the plan alone (`combined_edges`), so they always agree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from nopstream.plan.partitioned import Edge, PartitionedPlan
from nopstream.plan.streamgraph import EdgePolicy, StreamNode
from nopstream.records import Batch
from nopstream.runtime.functions import resolve
from nopstream.runtime.keyed import key_function
from nopstream.runtime.operators.aggregates import aggregator, is_count

COMBINED_TYPES = frozenset({"aggregate", "reduce"})


def combines(edge: Edge, target: StreamNode) -> bool:
    """Whether `edge`'s upstream pre-aggregates for `target`, the operator at its end."""
    return (
        edge.policy is EdgePolicy.HASH
        and target.type in COMBINED_TYPES
        and target.spec.get("emit") == "final"
        and target.spec.get("window") is None
        and target.spec.get("combine", True) is not False
        and edge.key is not None
        and edge.key == target.key
    )


def combined_edges(plan: PartitionedPlan) -> frozenset[str]:
    """The ids of the edges of `plan` whose records travel as partial accumulators."""
    operators = plan.operators()
    return frozenset(e.edge_id for e in plan.edges if combines(e, operators[e.target_operator]))


class Combiner:
    """The partial accumulators of one upstream subtask's HASH edge into a final aggregate or reduce."""

    def __init__(self, edge: Edge, target: StreamNode, *, limit: int) -> None:
        """Fold by `edge`'s key the way `target` does; `full` once `limit` keys are held."""
        assert edge.key is not None
        self.key_fn = key_function(edge.key)
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
            partials.update(map(key_fn, batch.records))
            return
        fold, first = self._fold, self._first
        for r in batch.records:
            k = key_fn(r)
            partials[k] = fold(partials[k], r) if k in partials else first(r)

    def drain(self) -> dict[Any, Any]:
        """Every partial accumulator by key, handed over; the combiner is empty after."""
        partials, self.partials = self.partials, self._fresh()
        return partials
