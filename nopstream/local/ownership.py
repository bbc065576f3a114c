"""One running job per checkpoint namespace and per sink output: the locks `nopstream run` holds.

A lock file per (storage, namespace), held with `flock` for the whole command, so a
second `nopstream run` of the same namespace is refused at once, naming the holder,
before it touches anything. The kernel releases the lock when the holder dies, even
by SIGKILL, so a crashed run never leaves a stale lock behind. For local checkpoint
storage the lock file lives in the storage directory (`locks/`, beside
`checkpoint/`), so every run using that directory is excluded, whatever its working
directory; for S3 storage it lives in this user's private directory
(`safefiles.user_dir`), so this user's runs on one machine are excluded (with `--etcd`
the job's lease excludes the others). Lock files are never opened through a link nor
when another user owns them, so nobody else can hold a job back or have us write
through their file (`safefiles.open_lock`).

Each sink output (a file sink's resolved directory, an S3 prefix, a Kafka topic, a
PostgreSQL table, with the job, pipeline and sink id) is locked the same way in this
user's private directory: the names a sink writes carry the job's identity, not its
checkpoint storage, so two runs of one job with two storages would write over each
other's staged and committed output.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from nopstream import safefiles
from nopstream.checkpoint.storage import LocalStorage, Storage
from nopstream.connectors import registry
from nopstream.model.catalogue import SINK_TYPES
from nopstream.plan.partitioned import PartitionedPlan
from nopstream.plan.streamgraph import StreamNode


class NamespaceHeld(RuntimeError):
    """Another run holds the checkpoint namespace or a sink's output; the message names it and its holder."""


def lock_path(storage: Storage, namespace: str) -> Path:
    """The lock file of a checkpoint namespace in a storage."""
    digest = hashlib.sha256(f"{storage.describe()}\0{namespace}".encode()).hexdigest()[:24]
    if isinstance(storage, LocalStorage):
        return storage.root / "locks" / f"{digest}.lock"
    return safefiles.user_dir() / "locks" / f"{digest}.lock"


def sink_location(node: StreamNode) -> str | None:
    """Where a sink node writes (a file sink's directory resolved); None when it has no place of its own."""
    anchored = registry.sink_kind(node.type).anchored(node.spec.get("config", {}))
    return SINK_TYPES[node.type].config.model_validate(anchored).location()


def _sink_outputs(plan: PartitionedPlan) -> list[tuple[str, Path]]:
    """(what, lock file) of every sink output of the job: its place and the job's identity in it."""
    ident = plan.identity
    outputs = []
    for node in plan.operators().values():
        where = sink_location(node) if node.kind == "sink" else None
        if where is not None:
            key = f"{where}\0{ident.job_id}\0{ident.pipeline_id}\0{node.node_id}"
            digest = hashlib.sha256(key.encode()).hexdigest()[:24]
            outputs.append(
                (f"sink '{node.node_id}' output {where}", safefiles.user_dir() / "locks" / f"{digest}.lock")
            )
    return outputs


@contextlib.contextmanager
def hold(storage: Storage, plan: PartitionedPlan, *, holder: str) -> Iterator[None]:
    """Hold the job's checkpoint namespace and every sink output while the block runs; NamespaceHeld when
    another process holds one of them.

    Sink outputs are held as well because they are named by the job's identity, not by
    its checkpoint storage: two runs of one job with two storages (two working
    directories) would otherwise write the same staged and committed names.
    """
    namespace = plan.identity.checkpoint_namespace
    with contextlib.ExitStack() as held:
        held.enter_context(
            _held(
                lock_path(storage, namespace),
                f"checkpoint namespace '{namespace}' in {storage.describe()}",
                "one running job per checkpoint namespace",
                holder,
            )
        )
        for what, path in _sink_outputs(plan):
            held.enter_context(_held(path, what, "one running job per sink output", holder))
        yield


@contextlib.contextmanager
def _held(path: Path, what: str, rule: str, holder: str) -> Iterator[None]:
    """Hold a lock file while the block runs, `holder` written in it; NamespaceHeld naming another holder."""
    safefiles.trusted_dir(path.parent, what="the lock directory", mode=0o700)
    fd = safefiles.open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            raise NamespaceHeld(f"{what} is held by {other} ({rule})") from None
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder} (pid {os.getpid()}, since {started})\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
