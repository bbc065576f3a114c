"""The `s3` source and sink, on any S3 endpoint (MinIO in the tests).

Source (REPLAYABLE): the objects under `prefix`, one split per object, read as text
lines or JSON lines. Split `key` belongs to subtask `stableHash(key) mod parallelism`.
Cursor: the byte offset of the next line (an exclusive cut); `snapshot` returns every
split's cursor, the finished objects and the ETag of each object begun; `restore`
resumes each at its cursor, and refuses (naming the split) when an unfinished object
begun is gone or has another ETag: an object being read must not change.

Sink (STAGED_ATOMIC_COMMIT): transaction N of a subtask collects its records and, at
barrier N, is PUT as the staged object `{prefix}.staging/{object}` (durable once the
PUT returns; object names in `staged`). Committing publishes it by a server-side copy
to `{prefix}{object}` and removes the staged object; a commit finds nothing to do
when it already happened (idempotent), and never copies over a committed object with
other contents (ETags differ). `recover` at every start: see `staged.StagedSink`.
Credentials: those of checkpoint storage (`nopstream.s3.credentials`).
"""

from __future__ import annotations

import os
from typing import Any

from nopstream.connectors import lines as line_format
from nopstream.connectors.staged import ObjectSink, OutputConflict, SinkName
from nopstream.errors import RestoreRefused
from nopstream.model.connectors import S3SinkConfig, S3SourceConfig
from nopstream.plan.keys import stable_hash
from nopstream.records import Batch
from nopstream.s3 import S3Storage

_RULE = "an object being read must not change (docs/runtime.md)"


def connect(config: S3SourceConfig | S3SinkConfig) -> S3Storage:
    """The bucket of a connector config (credentials: `nopstream.s3.credentials`)."""
    endpoint = config.endpoint or os.environ.get("NOPSTREAM_S3_ENDPOINT", "")
    return S3Storage.connect(endpoint, config.bucket)


class S3Source:
    """Reads the objects of one source subtask."""

    def __init__(self, config: S3SourceConfig | dict[str, Any], *, subtask: int, parallelism: int) -> None:
        """List the objects of this subtask."""
        c = S3SourceConfig.model_validate(config)
        self.store = connect(c)
        self.prefix = c.prefix
        self.jsonl = c.format == "jsonl"
        self.subtask = subtask
        self.parallelism = parallelism
        self.cursors: dict[str, int] = {}
        self.finished: set[str] = set()
        self.etags: dict[str, str] = {}
        self._lines: list[bytes] = []
        self._current: str | None = None
        for key in self.store.list(self.prefix):
            if stable_hash(key) % parallelism == subtask:
                self.cursors[key] = 0

    def read(self, max_records: int) -> Batch | None:
        """Up to `max_records` lines of the current object."""
        while True:
            if self._current is None:
                todo = sorted(k for k in self.cursors if k not in self.finished)
                if not todo:
                    return None
                self._current = todo[0]
                self.etags.setdefault(self._current, self.store.etag(self._current) or "")
                self._lines = self.store.get_from(self._current, self.cursors[self._current]).splitlines(True)
            if not self._lines:
                self.finished.add(self._current)
                self._current = None
                continue
            lines, self._lines = self._lines[:max_records], self._lines[max_records:]
            self.cursors[self._current] += sum(len(line) for line in lines)
            return Batch(line_format.decode(lines, jsonl=self.jsonl))

    def snapshot(self) -> dict[str, Any]:
        """Cursor of every split, the finished objects, and the ETags of the unfinished ones begun."""
        begun = {k: e for k, e in self.etags.items() if k not in self.finished and self.cursors.get(k)}
        return {"cursors": dict(self.cursors), "finished": sorted(self.finished), "etags": begun}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume every split at its cursor; RestoreRefused when an unfinished object begun changed."""
        finished = set(state.get("finished", []))
        for key, cursor in state.get("cursors", {}).items():
            if stable_hash(key) % self.parallelism != self.subtask:
                continue
            if key not in self.cursors and int(cursor) and key not in finished:
                raise RestoreRefused(f"split '{key}' is gone, its cursor is at byte {cursor}: {_RULE}")
            if key in self.cursors:
                self.cursors[key] = int(cursor)
        self.finished = {k for k in finished if k in self.cursors}
        self.etags = {k: str(e) for k, e in state.get("etags", {}).items() if k in self.cursors}
        for key, etag in self.etags.items():
            if key not in self.finished and self.store.etag(key) != etag:
                raise RestoreRefused(
                    f"split '{key}' changed under its cursor (its ETag is not {etag}): {_RULE}"
                )
        self._current, self._lines = None, []

    def close(self) -> None:
        """Nothing to release."""


class S3Sink(ObjectSink):
    """Writes a sink subtask's records as one object per committed epoch (bookkeeping: `ObjectSink`)."""

    def __init__(self, config: S3SinkConfig | dict[str, Any], *, name: SinkName) -> None:
        """Write under the config's bucket and prefix."""
        super().__init__(name)
        c = S3SinkConfig.model_validate(config)
        self.store = connect(c)
        self.prefix = c.prefix
        self.jsonl = c.format == "jsonl"
        self._buffer: list[bytes] = []

    def _staged(self, epoch: int) -> str:
        return f"{self.prefix}.staging/{self._object(epoch)}"

    def write(self, batch: Batch) -> None:
        """Add the batch to the open transaction."""
        self._buffer.append(line_format.encode(batch.records, jsonl=self.jsonl))
        self.records += len(batch.records)

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
    return [r for k in keys for r in line_format.decode(store.get(k).splitlines(), jsonl=c.format == "jsonl")]
