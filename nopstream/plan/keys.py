"""The stable key hash: key -> 64-bit hash -> state shard -> owner subtask.

Hash policy `blake2b64-v1` (documented in docs/hashing.md):
1. Normalize the key so that keys Python treats as equal hash equally:
   bool -> int; a float with an integral value -> int; tuple -> list.
2. Encode it: str -> b"s" + UTF-8; int -> b"i" + decimal ASCII; float -> b"f" + repr;
   None -> b"n"; list/dict -> b"j" + canonical JSON of the normalized value
   (sorted keys, no spaces, UTF-8).
3. hash = unsigned big-endian integer of BLAKE2b with an 8-byte digest of those bytes.
4. shard = hash mod stateShardCount.

Never Python's `hash()`: it is salted per process (PYTHONHASHSEED).
WARNING: changing any step changes where every key's state lives; a new policy gets
a new name, and the compatibility check refuses a change of policy.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

HASH_POLICY = "blake2b64-v1"


def normalize_key(key: Any) -> Any:
    """The normalized form of a key: equal Python keys normalize to the same value."""
    if isinstance(key, bool):
        return int(key)
    if isinstance(key, float) and key.is_integer():
        return int(key)
    if isinstance(key, (list, tuple)):
        return [normalize_key(k) for k in key]
    if isinstance(key, dict):
        return {str(k): normalize_key(v) for k, v in key.items()}
    return key


def encode_key(key: Any) -> bytes:
    """The bytes that policy blake2b64-v1 hashes for a key."""
    key = normalize_key(key)
    if isinstance(key, str):
        return b"s" + key.encode("utf-8")
    if isinstance(key, int):
        return b"i" + str(key).encode("ascii")
    if isinstance(key, float):
        return b"f" + repr(key).encode("ascii")
    if key is None:
        return b"n"
    if isinstance(key, (list, dict)):
        text = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return b"j" + text.encode("utf-8")
    raise TypeError(f"key of type {type(key).__name__} is not hashable by {HASH_POLICY}")


def stable_hash(key: Any) -> int:
    """The 64-bit stable hash of a key under policy blake2b64-v1."""
    # a str (the commonest key) encodes as it is: the same bytes as encode_key, a third faster
    data = b"s" + key.encode("utf-8") if type(key) is str else encode_key(key)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def shard_of(key: Any, shard_count: int) -> int:
    """The state shard of a key: stable_hash(key) mod shard_count."""
    return stable_hash(key) % shard_count


def shard_range(subtask: int, parallelism: int, shard_count: int) -> tuple[int, int]:
    """The contiguous half-open shard range [start, end) owned by a subtask."""
    return (subtask * shard_count // parallelism, (subtask + 1) * shard_count // parallelism)


def owner_of_shard(shard: int, parallelism: int, shard_count: int) -> int:
    """The subtask whose `shard_range` contains `shard`."""
    return ((shard + 1) * parallelism - 1) // shard_count
