"""The stable key hash: fixed vectors, Python-equality normalization, seed independence."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from nopstream.plan.keys import encode_key, owner_of_shard, shard_of, shard_range, stable_hash
from tests.conftest import ROOT

# Test vectors of policy blake2b64-v1 (docs/hashing.md); they never change. Each was
# cross-checked outside Python: printf 'shello' | b2sum -l 64 (coreutils).
VECTORS = [
    ("hello", 15768710110751428397),
    ("grüße", 10063363496211210576),
    ("", 16593940277942513374),
    (42, 1027869399216032918),
    (None, 6753767377493465268),
    (["a", 1], 805676484245613185),
]


@pytest.mark.parametrize(("key", "expected"), VECTORS)
def test_vectors(key, expected):
    assert stable_hash(key) == expected


def test_a_str_subclass_hashes_as_its_str():
    class Name(str):
        pass

    assert stable_hash(Name("grüße")) == stable_hash("grüße") == VECTORS[1][1]


def test_keys_python_treats_as_equal_hash_equally():
    assert stable_hash(1) == stable_hash(1.0) == stable_hash(True)
    assert stable_hash(("a", 1)) == stable_hash(["a", 1.0])
    assert stable_hash({"b": 1, "a": 2}) == stable_hash({"a": 2, "b": 1})
    assert stable_hash("1") != stable_hash(1)
    assert encode_key(1.5) == b"f1.5"


def test_unhashable_key_type_is_refused():
    with pytest.raises(TypeError, match="key of type set is not hashable by blake2b64-v1"):
        stable_hash({1, 2})


@pytest.mark.parametrize("shards", [1, 7, 128, 1000])
@pytest.mark.parametrize("parallelism", [1, 2, 3, 5, 7])
def test_ranges_are_contiguous_and_owner_matches(shards, parallelism):
    if parallelism > shards:
        return
    ranges = [shard_range(i, parallelism, shards) for i in range(parallelism)]
    assert ranges[0][0] == 0 and ranges[-1][1] == shards
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    for s in range(shards):
        lo, hi = ranges[owner_of_shard(s, parallelism, shards)]
        assert lo <= s < hi


SCRIPT = """
import json, sys
from nopstream.model.load import load_file
from nopstream.plan import compiler
from nopstream.plan.keys import shard_of
plans = compiler.compile_model(load_file("examples/wordcount.yaml"))
keys = ["the", "fox", 17, ["a", 2], "ünïcode"]
print(json.dumps({"fp": compiler.dump_document(plans.partitioned)[-80:],
                  "shards": [shard_of(k, 128) for k in keys]}))
"""


def test_compiler_and_hash_do_not_depend_on_pythonhashseed():
    outputs = set()
    for seed in ("0", "1", "12345", "random"):
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            cwd=ROOT,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.add(proc.stdout)
    assert len(outputs) == 1
    shards = json.loads(outputs.pop())["shards"]
    assert shards == [shard_of(k, 128) for k in ["the", "fox", 17, ["a", 2], "ünïcode"]]
