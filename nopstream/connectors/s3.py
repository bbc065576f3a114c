"""The `s3` source and sink, on any S3 endpoint (MinIO in the tests).

Source (REPLAYABLE): the objects under `prefix`, read as text, JSON or CSV lines,
each spread over the source's subtasks in stripes (`connectors.striped`) and read by
ranged GETs of `READ_BYTES`, so a subtask holds at most that much of an object
however large it is. Each GET asks for the ETag the object had when opened; a restore
refuses (naming the split) an object begun that is gone, shorter than its cursor, or
has another ETag: an object being read must not change.

Sink (STAGED_ATOMIC_COMMIT): transaction N of a subtask collects its records and, at
barrier N, is PUT as the staged object `{prefix}.staging/{object}` (durable once the
PUT returns; object names in `staged`). Committing publishes it by a server-side copy
to `{prefix}{object}` and removes the staged object; a commit finds nothing to do
when it already happened (idempotent), and never copies over a committed object with
other contents (ETags differ). `recover` at every start: see `staged.StagedSink`.
Credentials: those of checkpoint storage (`nopstream.s3.credentials`).
"""

from __future__ import annotations

import io
import os
from typing import Any, BinaryIO, cast

from nopstream.connectors.object_format import object_source, sink_format
from nopstream.connectors.staged import ObjectSink, OutputConflict, SinkName
from nopstream.connectors.striped import at_cursor as _at
from nopstream.errors import RestoreRefused, StorageError
from nopstream.model.connectors import S3SinkConfig, S3SourceConfig
from nopstream.records import Batch, SourceReader
from nopstream.s3 import ObjectStat, S3Storage

_RULE = "an object being read must not change (docs/runtime.md)"
READ_BYTES = 1 << 20
"""The most bytes of an object one ranged GET asks for."""
_TAIL = 1 << 16


def connect(config: S3SourceConfig | S3SinkConfig) -> S3Storage:
    """The bucket of a connector config (credentials: `nopstream.s3.credentials`)."""
    endpoint = config.endpoint or os.environ.get("NOPSTREAM_S3_ENDPOINT", "")
    return S3Storage.connect(endpoint, config.bucket)


class _Ranged(io.RawIOBase):
    """An object read by ranged GETs at a position, each only if its ETag is still the one opened.

    A GET asks for what the buffer wants, but not past `until` (the end of what the
    reader means to read); past it, `_TAIL` at a time: the rest of a line crossing it.
    """

    def __init__(self, store: S3Storage, name: str, found: ObjectStat) -> None:
        self.store, self.name, self.found, self.pos = store, name, found, 0
        self.until = found.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.found.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: Any) -> int:
        ahead = self.until - self.pos if self.pos < self.until else _TAIL
        n = min(len(buffer), ahead, self.found.size - self.pos)
        if n <= 0:
            return 0
        data = self.store.get_range(self.name, self.pos, n, etag=self.found.etag)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


class BucketObjects:
    """The objects under a prefix, each told from another under its key by its ETag."""

    identity_field = "etags"

    def __init__(self, store: S3Storage, prefix: str) -> None:
        """The objects of `store` under `prefix`."""
        self.store = store
        self.prefix = prefix
        self._listed: dict[str, ObjectStat] = {}
        self._opened: dict[str, _Ranged] = {}

    def names(self) -> list[str]:
        """Every object under the prefix now, in key order."""
        self._listed = self.store.listing(self.prefix)
        return sorted(self._listed)

    def open(self, name: str, identity: Any) -> BinaryIO:
        """The object as listed, read `READ_BYTES` at most at a time, each read only while its
        ETag is `identity` (the one it had when begun) or, for one not begun, the listed one.

        No request: the listing gave its size and ETag, so a subtask that owns no stripe
        of a small object costs the store nothing for it.
        """
        found = self._listed.get(name) or self.store.stat(name)
        if found is None:
            raise StorageError(f"{self.store.describe()}/{name} is missing")
        if identity is not None:
            found = ObjectStat(found.size, str(identity))
        raw = self._opened[name] = _Ranged(self.store, name, found)
        return cast(BinaryIO, io.BufferedReader(raw, buffer_size=READ_BYTES))

    def size(self, name: str, handle: BinaryIO) -> int:
        """The object's size when opened (every read since checked that it is the same object)."""
        return self._opened[name].found.size

    def reading_to(self, name: str, end: int) -> None:
        """GETs of `name` stop at `end`, then go on a line's worth at a time."""
        self._opened[name].until = end

    def identity(self, name: str) -> str:
        """The ETag of the object opened under `name` (of the object now, if not opened yet)."""
        raw = self._opened.get(name)
        found = raw.found if raw is not None else self.store.stat(name)
        return found.etag if found is not None else ""

    def check(self, split: str, name: str, cursor: int | None, identity: Any) -> None:
        """RestoreRefused naming the split when its object is gone, shorter, or another ETag's."""
        found = self.store.stat(name)
        if found is None:
            raise RestoreRefused(f"split '{split}' is gone{_at(cursor)}: {_RULE}")
        if identity is not None and found.etag != identity:
            raise RestoreRefused(
                f"split '{split}' changed under its cursor (its ETag is not {identity}): {_RULE}"
            )
        if cursor is not None and found.size < cursor:
            raise RestoreRefused(
                f"split '{split}' changed under its cursor: the object has {found.size} bytes, the cursor"
                f" is at byte {cursor}: {_RULE}"
            )


def s3_source(
    config: S3SourceConfig | dict[str, Any],
    *,
    subtask: int,
    parallelism: int,
    keep_unreadable: bool = False,
) -> SourceReader:
    """The reader of one source subtask's share of the objects (`object_format.object_source`)."""
    c = S3SourceConfig.model_validate(config)
    objects = BucketObjects(connect(c), c.prefix)
    return object_source(
        objects, c, subtask=subtask, parallelism=parallelism, keep_unreadable=keep_unreadable
    )


class S3Sink(ObjectSink):
    """Writes a sink subtask's records as one object per committed epoch (bookkeeping: `ObjectSink`)."""

    def __init__(self, config: S3SinkConfig | dict[str, Any], *, name: SinkName) -> None:
        """Write under the config's bucket and prefix."""
        c = S3SinkConfig.model_validate(config)
        fmt = sink_format(c)
        # text objects keep the name they always had (.jsonl), so restores find what they staged
        super().__init__(name, fmt, "jsonl" if c.format == "text" else fmt.ext)
        self.store = connect(c)
        self.prefix = c.prefix
        self._buffer: list[bytes] = []

    def _staged(self, epoch: int) -> str:
        return f"{self.prefix}.staging/{self._object(epoch)}"

    def write(self, batch: Batch) -> None:
        """Add the batch to the open transaction."""
        self._buffer.append(self._add(batch.records, "s3"))
        self.records += len(batch.records)

    def _release(self) -> None:
        """The open transaction's object ended."""
        self._buffer.append(self._end())

    def _stage(self, epoch: int) -> None:
        self.store.put(self._staged(epoch), b"".join(self._buffer))

    def prepare(self, epoch: int) -> None:
        """Barrier `epoch`: PUT the staged object (pre-commit) and open the next transaction."""
        super().prepare(epoch)
        self._buffer = []

    def _publish(self, epoch: int, lineage: int) -> None:
        staged = f"{self.prefix}.staging/{self._object(epoch, lineage)}"
        final = f"{self.prefix}{self._object(epoch, lineage)}"
        staged_tag, final_tag = self.store.etag(staged), self.store.etag(final)
        if staged_tag is None:
            if final_tag is not None:
                return  # published before
            raise OutputConflict(f"transaction {self.txn_prefix}:{epoch} has no staged object {staged}")
        if final_tag is not None and final_tag != staged_tag:
            raise OutputConflict(
                f"refusing to replace committed output {self._location(final[len(self.prefix) :])}: it is not"
                f" transaction {self.txn_prefix}:{epoch}"
            )
        self.store.copy(staged, final)
        self.store.delete(staged)

    def _staged_names(self) -> list[str]:
        staging = f"{self.prefix}.staging/"
        return [key[len(staging) :] for key in self.store.list(f"{staging}{self.name.job_id}.")]

    def _committed_names(self) -> list[str]:
        base = self._object(0).rsplit(".", 2)[0]  # the names of this lineage, without epoch and ext
        return [key[len(self.prefix) :] for key in self.store.list(f"{self.prefix}{base}.")]

    def _drop_staged(self, name: str) -> None:
        self.store.delete(f"{self.prefix}.staging/{name}")

    def _location(self, name: str) -> str:
        return f"s3://{self.store.bucket}/{self.prefix}{name}"

    def finish(self) -> None:
        """Nothing to release: the open transaction waits for the final epoch."""


def committed_records(config: S3SinkConfig | dict[str, Any]) -> list[Any]:
    """Every record an s3 sink committed under its prefix, decoded (`nopstream chaos`)."""
    c = S3SinkConfig.model_validate(config)
    store = connect(c)
    keys = [k for k in store.list(c.prefix) if not k[len(c.prefix) :].startswith(".staging/")]
    fmt = sink_format(c)
    return [r for k in keys for r in fmt.records(store.get(k))]
