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
from enum import StrEnum
from typing import Any

from nopstream.cluster.backend import Backend
from nopstream.cluster.election import Leadership
from nopstream.cluster.layout import Layout
from nopstream.plan.epochs import EpochKind


class EpochState(StrEnum):
    """The states an epoch passes through in the log."""

    CREATED = "CREATED"
    DURABLE = "DURABLE"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


@dataclass(frozen=True)
class EpochEntry:
    """One epoch's latest log entry."""

    epoch: int
    state: EpochState
    token: int
    writer: str
    detail: dict[str, Any]
    at: int | None = None
    """When the entry was written (ms since the Unix epoch, the writer's clock)."""

    @property
    def kind(self) -> EpochKind:
        """The epoch's kind (entries that name none are checkpoints)."""
        return EpochKind(self.detail.get("kind", EpochKind.CHECKPOINT))


class EpochLog:
    """Reads and (fenced) writes of one job's epoch log."""

    def __init__(self, backend: Backend, layout: Layout) -> None:
        """The log of the job at `layout`."""
        self.backend = backend
        self.layout = layout

    async def record(self, leadership: Leadership, epoch: int, state: EpochState, **detail: Any) -> None:
        """Write an epoch's state as the leader; Fenced when no longer the leader."""
        entry = {
            "epoch": epoch,
            "state": state.value,
            "token": leadership.token,
            "writer": leadership.candidate,
            "detail": detail,
            "at": int(time.time() * 1000),
        }
        writes = {self.layout.epoch(epoch): json.dumps(entry, sort_keys=True).encode()}
        if state is EpochState.DURABLE:  # the entry moves on to COMMITTED; the pointer keeps the time
            pointer = {
                "epoch": epoch,
                "token": leadership.token,
                "writer": leadership.candidate,
                "at": entry["at"],
            }
            writes[self.layout.latest_durable] = json.dumps(pointer, sort_keys=True).encode()
        await leadership.write(writes)

    async def entries(self) -> list[EpochEntry]:
        """Every epoch's latest entry, by epoch."""
        found = await self.backend.get_prefix(self.layout.epochs)
        out = []
        for entry in found.values():
            data = json.loads(entry.value)
            out.append(
                EpochEntry(
                    int(data["epoch"]),
                    EpochState(data["state"]),
                    int(data["token"]),
                    data["writer"],
                    data.get("detail", {}),
                    data.get("at"),
                )
            )
        return sorted(out, key=lambda e: e.epoch)

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
