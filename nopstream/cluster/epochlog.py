"""The epoch log: each epoch's state, written only by the current coordinator.

Entries are JSON under `epochs/{epoch}`: `{"epoch", "state", "token", "writer",
"detail", "at"}` (`at`: the writer's wall clock in milliseconds, what status ages are
read from; entries of older versions have none). Every write is fenced by the
writer's leadership (one transaction with the leader check); marking an epoch
DURABLE moves the `latest-durable` pointer in the same transaction. Recovery never
relies on COMMITTED: it re-commits every DURABLE.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from nopstream.cluster.backend import Backend
from nopstream.cluster.election import Leadership
from nopstream.cluster.layout import Layout
from nopstream.plan.epochs import EpochKind, EpochState


@dataclass(frozen=True)
class EpochEntry:
    """One epoch's latest log entry; the one codec of its JSON (what the writer says of the epoch is
    kept under `detail`)."""

    epoch: int
    state: EpochState
    token: int
    writer: str
    kind: EpochKind = EpochKind.CHECKPOINT
    """The epoch's kind (entries that name none are checkpoints)."""
    run: int | None = None
    """The run the epoch was taken in."""
    manifest: str | None = None
    """The manifest's path, once DURABLE."""
    reason: str | None = None
    """Why it was ABORTED."""
    missing: tuple[str, ...] = ()
    """The tasks whose ACK an epoch ABORTED by its timeout lacked."""
    adopted: bool = False
    """CREATED again by a coordinator that took over the epoch in flight."""
    at: int | None = None
    """When the entry was written (ms since the Unix epoch, the writer's clock)."""

    def to_json(self) -> dict[str, Any]:
        """The entry as the log holds it."""
        detail: dict[str, Any] = {"kind": self.kind.value}
        for name, value in (("run", self.run), ("manifest", self.manifest), ("reason", self.reason)):
            if value is not None:
                detail[name] = value
        if self.missing:
            detail["missing"] = list(self.missing)
        if self.adopted:
            detail["adopted"] = True
        entry = {"epoch": self.epoch, "state": self.state.value, "token": self.token, "writer": self.writer}
        return {**entry, "detail": detail, "at": self.at}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpochEntry:
        """From `to_json()`'s object, or an older writer's (no `at`, a detail without `kind`)."""
        detail = data.get("detail") or {}
        run, at = detail.get("run"), data.get("at")
        return cls(
            epoch=int(data["epoch"]),
            state=EpochState(data["state"]),
            token=int(data["token"]),
            writer=str(data["writer"]),
            kind=EpochKind(detail.get("kind", EpochKind.CHECKPOINT)),
            run=None if run is None else int(run),
            manifest=detail.get("manifest"),
            reason=detail.get("reason"),
            missing=tuple(detail.get("missing", ())),
            adopted=bool(detail.get("adopted", False)),
            at=None if at is None else int(at),
        )


class EpochLog:
    """Reads and (fenced) writes of one job's epoch log."""

    def __init__(self, backend: Backend, layout: Layout) -> None:
        """The log of the job at `layout`."""
        self.backend = backend
        self.layout = layout

    async def record(
        self,
        leadership: Leadership,
        epoch: int,
        state: EpochState,
        *,
        kind: EpochKind = EpochKind.CHECKPOINT,
        run: int | None = None,
        manifest: str | None = None,
        reason: str | None = None,
        missing: tuple[str, ...] = (),
        adopted: bool = False,
    ) -> None:
        """Write an epoch's state as the leader; Fenced when no longer the leader."""
        at = int(time.time() * 1000)
        token, writer = leadership.token, leadership.candidate
        entry = EpochEntry(epoch, state, token, writer, kind, run, manifest, reason, missing, adopted, at)
        writes = {self.layout.epoch(epoch): json.dumps(entry.to_json(), sort_keys=True).encode()}
        if state is EpochState.DURABLE:  # the entry moves on to COMMITTED; the pointer keeps the time
            pointer = {"epoch": epoch, "token": token, "writer": writer, "at": at}
            writes[self.layout.latest_durable] = json.dumps(pointer, sort_keys=True).encode()
        await leadership.write(writes)

    async def entries(self) -> list[EpochEntry]:
        """Every epoch's latest entry, by epoch."""
        found = await self.backend.get_prefix(self.layout.epochs)
        return sorted(
            (EpochEntry.from_json(json.loads(e.value)) for e in found.values()), key=lambda e: e.epoch
        )

    async def latest_durable(self) -> int | None:
        """The latest durable epoch, or None."""
        return (await self.latest_durable_at())[0]

    async def latest_durable_at(self) -> tuple[int | None, int | None]:
        """The latest durable epoch and when it became durable (ms, None from older writers), or Nones."""
        entry = await self.backend.get(self.layout.latest_durable)
        pointer = {} if entry is None else json.loads(entry.value)
        epoch, at = pointer.get("epoch"), pointer.get("at")
        return (None, None) if epoch is None else (int(epoch), None if at is None else int(at))

    async def disown_latest(self, leadership: Leadership, reason: str) -> None:
        """Fenced: the latest-durable pointer no longer names an epoch (checkpoint storage disagrees)."""
        pointer = {"epoch": None, "token": leadership.token, "writer": leadership.candidate, "reason": reason}
        await leadership.write({self.layout.latest_durable: json.dumps(pointer, sort_keys=True).encode()})


@dataclass(frozen=True)
class LeaderLog:
    """The epoch log as one leadership writes it (what the epoch coordinator is given)."""

    log: EpochLog
    leadership: Leadership

    async def record(self, epoch: int, state: EpochState, **detail: Any) -> None:
        """`EpochLog.record` fenced by this leadership."""
        await self.log.record(self.leadership, epoch, state, **detail)
