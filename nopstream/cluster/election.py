"""Leader election of a job's coordinator, and fenced writes by the leader.

Candidates race to create the job's `coordinator` key bound to their lease; the
winner's **fencing token** is the revision that created the key. Standbys watch the
key and campaign again when it goes (its holder's lease ended). Every write a leader
makes is a transaction that also checks the key still has its create revision: once
another candidate has won (the key was deleted and created again), the old leader's
writes fail with `Fenced` and it must step down.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from nopstream.cluster.backend import Backend
from nopstream.cluster.errors import Fenced
from nopstream.cluster.layout import Layout
from nopstream.cluster.leases import LeaseKeeper


@dataclass(frozen=True)
class Leadership:
    """A won election: who, the fencing token every write is checked against, and its lease."""

    backend: Backend
    layout: Layout
    candidate: str
    token: int
    keeper: LeaseKeeper

    async def write(self, writes: dict[str, bytes]) -> None:
        """Write keys atomically while still the leader; Fenced otherwise.

        A leader whose lease keeper has reported the lease lost fences itself: the
        store may still hold its key for a while (etcd renews leases when it
        restarts), but the holder has stopped acting.
        """
        if self.keeper.lost.is_set():
            raise Fenced(f"coordinator {self.candidate} (token {self.token}) lost its lease")
        ok = await self.backend.put_if_created_at(
            writes, guard=self.layout.coordinator, create_revision=self.token
        )
        if not ok:
            raise Fenced(f"coordinator {self.candidate} (token {self.token}) is no longer the leader")


class Election:
    """Campaigns for the coordinator key of one job."""

    def __init__(self, backend: Backend, layout: Layout, candidate: str, *, endpoint: str = "") -> None:
        """A candidate named `candidate` (unique per process, e.g. pod name), serving at `endpoint`."""
        self.backend = backend
        self.layout = layout
        self.candidate = candidate
        self.endpoint = endpoint

    async def campaign(self, keeper: LeaseKeeper) -> Leadership:
        """Wait until this candidate leads; the key is bound to the keeper's lease."""
        key = self.layout.coordinator
        value = LeaderKey(self.candidate, 0, self.endpoint).to_json()
        while True:
            start = await self.backend.revision()
            token = await self.backend.create(key, value, lease=keeper.lease)
            if token is not None:
                return Leadership(self.backend, self.layout, self.candidate, token, keeper)
            current = await self.backend.get(key)
            if current is None:
                continue
            async with contextlib.aclosing(
                self.backend.watch_prefix(key, start_revision=start + 1)
            ) as events:
                async for event in events:
                    if event.key == key and event.kind == "delete":
                        break

    async def leader(self) -> tuple[str, int] | None:
        """(candidate, token) of the current leader, if any."""
        found = await current_leader(self.backend, self.layout)
        return None if found is None else (found.candidate, found.token)

    async def leader_endpoint(self) -> str | None:
        """Where the current leader serves (tasks send it their ACKs), if there is one."""
        found = await current_leader(self.backend, self.layout)
        return None if found is None else found.endpoint


@dataclass(frozen=True)
class LeaderKey:
    """The coordinator key: who leads, with which fencing token (the key's create revision), serving
    where; its JSON written by `Election.campaign` and read here only."""

    candidate: str
    token: int
    endpoint: str | None = None

    def to_json(self) -> bytes:
        """The key's value (the token is the key's revision, not in its value)."""
        return json.dumps({"candidate": self.candidate, "endpoint": self.endpoint}).encode()


async def current_leader(backend: Backend, layout: Layout) -> LeaderKey | None:
    """The job's current leader, if it has one."""
    entry = await backend.get(layout.coordinator)
    if entry is None:
        return None
    said = json.loads(entry.value)
    return LeaderKey(str(said["candidate"]), entry.create_revision, said.get("endpoint") or None)
