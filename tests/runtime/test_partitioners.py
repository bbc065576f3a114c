"""A HASH edge splits a batch at once: keys in one call, owners in one more, records last."""

from __future__ import annotations

import random

from nopstream.plan.keys import owner_of_shard, shard_of
from nopstream.plan.partitioned import Edge, ShardRange
from nopstream.plan.streamgraph import EdgePolicy, KeySelector
from nopstream.records import Batch
from nopstream.runtime.keyed import batch_keys, key_function
from nopstream.runtime.partitioners import Partitioner

FIELD = KeySelector(field="k", fn=None)


def test_a_batch_of_field_keys_is_read_at_once_and_a_list_value_keys_as_a_tuple():
    keys = batch_keys(FIELD)
    assert keys([{"k": "a"}, {"k": 2}, {"k": "a"}]) == ["a", 2, "a"]
    records = [{"k": [1, 2]}, {"k": "a"}]
    assert keys(records) == [key_function(FIELD)(r) for r in records] == [(1, 2), "a"]


def test_every_record_goes_to_its_keys_owner_with_its_timestamp():
    shards, parallelism = 128, 3
    owners = tuple(ShardRange(i * 43, min(shards, (i + 1) * 43)) for i in range(parallelism))
    edge = Edge("a->b", "a", "a", "main", "b", "b", 0, EdgePolicy.HASH, FIELD, "v1", shards, owners, ())
    partitioner = Partitioner(edge, list(range(parallelism)))
    rng = random.Random(4)
    for _ in range(3):  # later batches find their owners cached
        records = [{"k": f"k{rng.randrange(500)}", "i": i} for i in range(2000)]
        stamps = list(range(2000))
        parts = dict(partitioner.split(Batch(records, stamps)))
        for downstream, part in parts.items():
            assert part.timestamps == [r["i"] for r in part.records]
            for r in part.records:
                assert owner_of_shard(shard_of(r["k"], shards), parallelism, shards) == downstream
        assert sorted(i for p in parts.values() for i in p.timestamps or []) == stamps
