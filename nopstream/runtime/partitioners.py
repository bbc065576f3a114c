"""Output partitioners: how one upstream subtask splits a batch over its channels of an edge.

Exactly the plan's edge policy: FORWARD and SINGLETON (one channel), HASH (key ->
shard -> owner subtask, with the plan's owner ranges), REBALANCE (whole batches
round-robin), BROADCAST (every channel), UNION (pointwise when the plan gave one
channel, else round-robin). Work is per batch; the key -> owner map is cached.
"""

from __future__ import annotations

from typing import Any

from nopstream.plan.keys import owner_of_shard, shard_of
from nopstream.plan.partitioned import Edge
from nopstream.plan.streamgraph import EdgePolicy
from nopstream.records import Batch
from nopstream.runtime.keyed import key_function

_CACHE_LIMIT = 1 << 20


class Partitioner:
    """Splits batches of one edge over the downstream subtasks this subtask has channels to."""

    def __init__(self, edge: Edge, downstream: list[int]) -> None:
        """Route by `edge`'s policy to the `downstream` subtask indexes of our channels."""
        self.policy = edge.policy
        self.downstream = downstream
        self._next = 0
        if edge.policy is EdgePolicy.HASH:
            if edge.key is None or edge.owners is None or edge.shard_count is None:
                raise ValueError(f"HASH edge {edge.edge_id} has no key, owners or shard count in the plan")
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

    def owner(self, key: Any) -> int:
        """The subtask that owns a key's shard."""
        owner = self._owner.get(key)
        if owner is None:
            if len(self._owner) >= _CACHE_LIMIT:
                self._owner.clear()
            owner = owner_of_shard(shard_of(key, self.shard_count), self.parallelism, self.shard_count)
            self._owner[key] = owner
        return owner

    def _hash(self, batch: Batch) -> list[tuple[int, Batch]]:
        key_fn, owners, owner = self.key_fn, self._owner, self.owner
        if self.parallelism == 1:
            return [(0, batch)]
        parts: list[list[Any]] = [[] for _ in range(self.parallelism)]
        if batch.timestamps is None:
            for r in batch.records:
                k = key_fn(r)
                o = owners.get(k)
                parts[owner(k) if o is None else o].append(r)
            return [(i, Batch(p)) for i, p in enumerate(parts) if p]
        stamps: list[list[int]] = [[] for _ in range(self.parallelism)]
        for r, t in zip(batch.records, batch.timestamps, strict=True):
            o = owner(key_fn(r))
            parts[o].append(r)
            stamps[o].append(t)
        return [(i, Batch(p, stamps[i])) for i, p in enumerate(parts) if p]
