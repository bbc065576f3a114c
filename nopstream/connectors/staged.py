"""Transaction bookkeeping shared by the committing sinks (STAGED_ATOMIC_COMMIT).

Transaction N holds the records between barriers N-1 and N; its id is
`{jobId}:{pipelineId}:{operatorId}:{subtask}:{N}`, never random. At barrier N a sink
stages it durably (`_stage`) and it becomes pending; committing epoch M publishes
every pending transaction <= M (`_publish`, idempotent); after a restore from
durable epoch D, `recover(D)` publishes the restored pending ones <= D and drops
everything staged for later epochs (`_abort_after`).
"""

from __future__ import annotations

from typing import Any

from nopstream.runtime import faults


class StagedSink:
    """Pending transactions, their snapshot and restore; subclasses stage and publish."""

    def __init__(self, txn_prefix: str) -> None:
        """Name transactions `{txn_prefix}:{epoch}`; the first open transaction is epoch 1."""
        self.txn_prefix = txn_prefix
        self.epoch = 1
        self.pending: list[dict[str, Any]] = []
        self.records = 0

    def _stage(self, epoch: int) -> None:
        """Make the open transaction's records durable under epoch `epoch` (only called with records)."""
        raise NotImplementedError

    def _publish(self, epoch: int) -> None:
        """Make a staged transaction visible; nothing to do when it already is."""
        raise NotImplementedError

    def _abort_after(self, durable: int) -> None:
        """Drop everything this subtask staged for epochs after `durable`."""
        raise NotImplementedError

    def prepare(self, epoch: int) -> None:
        """Barrier `epoch`: stage the open transaction (pre-commit) and open the next."""
        self._release()
        if self.records:
            self._stage(epoch)
            self.pending.append({"id": f"{self.txn_prefix}:{epoch}", "epoch": epoch, "records": self.records})
        self.records = 0
        self.epoch = epoch + 1

    def _release(self) -> None:
        """Hook: finish writing the open transaction before it is staged."""

    def commit(self, upto: int) -> None:
        """Publish every pending transaction of an epoch <= upto."""
        for txn in [t for t in self.pending if t["epoch"] <= upto]:
            self._publish(txn["epoch"])
            faults.reached("mid-commit")
            self.pending.remove(txn)

    def recover(self, durable: int) -> None:
        """After a restore: commit up to the durable epoch, abort every later transaction."""
        self.commit(durable)
        self._abort_after(durable)
        self.pending = [t for t in self.pending if t["epoch"] > durable]
        self.epoch = durable + 1

    def snapshot(self) -> dict[str, Any]:
        """Pending (pre-committed) transactions and the open transaction's epoch."""
        return {"pending": [dict(t) for t in self.pending], "epoch": self.epoch}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume with the snapshot's pending transactions."""
        self.pending = [dict(t) for t in state.get("pending", [])]
        self.epoch = int(state.get("epoch", 1))
