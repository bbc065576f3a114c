"""Output partitioners: how one upstream subtask splits a batch over its channels of an edge.

Exactly the plan's edge policy: FORWARD and SINGLETON (one channel), HASH (key ->
shard -> owner subtask, with the plan's owner ranges), REBALANCE (whole batches
round-robin), BROADCAST (every channel), UNION (pointwise when the plan gave one
channel, else round-robin). Work is per batch: a HASH edge takes a batch's keys in one
call (`keyed.batch_keys`: no Python call per record for a field key), looks their
owners up in the cached key -> owner map in one more, and only then touches records.
A record whose key cannot be taken fails the task naming the operator the edge leads to,
or, when that operator dead-letters, goes to the owner of key None: the operator takes
its key again and sets it aside.
"""

from __future__ import annotations

from typing import Any, TypeVar

from nopstream.errors import OperatorFailed
from nopstream.plan.keys import owner_of_shard, shard_of
from nopstream.plan.partitioned import Edge
from nopstream.plan.streamgraph import EdgePolicy, StreamNode
from nopstream.records import Batch
from nopstream.runtime.keyed import batch_keys, cached_all, key_function

_CACHE_LIMIT = 1 << 20
T = TypeVar("T")


class Partitioner:
    """Splits batches of one edge over the downstream subtasks this subtask has channels to."""

    def __init__(self, edge: Edge, downstream: list[int], target: StreamNode | None = None) -> None:
        """Route by `edge`'s policy to the `downstream` subtask indexes of our channels; `target`, the
        operator at the edge's end, says what a record whose key fails becomes."""
        self.policy = edge.policy
        self.downstream = downstream
        self._next = 0
        self.target = target
        if edge.policy is EdgePolicy.HASH:
            if edge.key is None or edge.owners is None or edge.shard_count is None:
                raise ValueError(f"HASH edge {edge.edge_id} has no key, owners or shard count in the plan")
            self.keys_of = batch_keys(edge.key)
            self.key_fn = key_function(edge.key)
            self.shard_count = edge.shard_count
            self.parallelism = len(edge.owners)
            self._owner: dict[Any, int] = {}

    def split(self, batch: Batch) -> list[tuple[int, Batch]]:
        """(downstream subtask, sub-batch) pairs covering the batch."""
        policy = self.policy
        if policy is EdgePolicy.HASH:
            return self._hash(batch)
        if policy is EdgePolicy.BROADCAST:
            return [(d, batch) for d in self.downstream]
        if len(self.downstream) == 1:
            return [(self.downstream[0], batch)]
        target = self.downstream[self._next % len(self.downstream)]
        self._next += 1
        return [(target, batch)]

    def route(
        self,
        keys: list[Any],
        records: list[Any],
        timestamps: list[int] | None = None,
        marks: list[int] | None = None,
    ) -> list[tuple[int, Batch]]:
        """(owner subtask, sub-batch) pairs of `records`, whose keys are `keys`, in their order."""
        if self.parallelism == 1:
            return [(0, Batch(records, timestamps, marks))]
        owners, n = cached_all(self._owner, keys, self._owner_of), self.parallelism
        parts = _by_owner(records, owners, n)
        stamps = None if timestamps is None else _by_owner(timestamps, owners, n)
        marked = None if marks is None else _by_owner(marks, owners, n)
        return [
            (i, Batch(p, None if stamps is None else stamps[i], None if marked is None else marked[i]))
            for i, p in enumerate(parts)
            if p
        ]

    def _owner_of(self, key: Any) -> int:
        owner = self._owner.get(key)
        if owner is None:
            if len(self._owner) >= _CACHE_LIMIT:
                self._owner.clear()
            owner = owner_of_shard(shard_of(key, self.shard_count), self.parallelism, self.shard_count)
            self._owner[key] = owner
        return owner

    def _hash(self, batch: Batch) -> list[tuple[int, Batch]]:
        if self.parallelism == 1:
            return [(0, batch)]
        try:
            keys = self.keys_of(batch.records)
        except Exception:
            keys = self._each_key(batch.records)
        return self.route(keys, batch.records, batch.timestamps, batch.marks)

    def _each_key(self, records: list[Any]) -> list[Any]:
        """The keys of `records` one by one, None for one whose key fails when the target dead-letters."""
        target, keys = self.target, []
        for record in records:
            try:
                keys.append(self.key_fn(record))
            except Exception as exc:
                if target is None or target.spec.get("onError") != "dead-letter":
                    what = f"operator '{target.node_id}' ({target.type})" if target else "a key selector"
                    raise OperatorFailed.of(what, exc) from exc
                keys.append(None)
        return keys


def _by_owner(values: list[T], owners: list[int], n: int) -> list[list[T]]:
    """`values` dealt to their owners (`owners[i]` is value i's), each owner's in their order."""
    parts: list[list[T]] = [[] for _ in range(n)]
    add = [p.append for p in parts]
    for v, o in zip(values, owners, strict=True):
        add[o](v)
    return parts
