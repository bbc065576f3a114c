"""The messages of a job's control plane that are not a task's records: each a frozen record with its
one codec, written and read by both ends of the wire."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nopstream.checkpoint.epochs import Ack
from nopstream.plan.epochs import EpochKind


@dataclass(frozen=True)
class TaskStatus:
    """What a task tells a coordinator that takes over: its run, whether its source finished, its last ACK."""

    run: int
    source_finished: bool = False
    last_ack: tuple[int, Ack] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON of GET /control/status."""
        ack = self.last_ack[1].to_json(self.last_ack[0]) if self.last_ack else None
        return {"run": self.run, "sourceFinished": self.source_finished, "ack": ack}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> TaskStatus:
        """Parse `to_json`'s output; ValueError when a part has another shape."""
        ack = body.get("ack")
        last = (int(ack["epoch"]), Ack.from_json(ack)) if isinstance(ack, dict) else None
        return cls(int(body["run"]), bool(body.get("sourceFinished")), last)


@dataclass(frozen=True)
class Command:
    """A coordinator's command to a task of its run (POST /control/barrier with its `kind`, POST
    /control/commit), fenced by the run and the coordinator's token."""

    epoch: int
    run: int
    token: int
    kind: str | None = None
    """A barrier's kind, as sent: read with `epoch_kind` once the command is admitted."""

    def to_json(self) -> dict[str, Any]:
        """The command's body."""
        body: dict[str, Any] = {"epoch": self.epoch, "run": self.run, "token": self.token}
        return body if self.kind is None else {**body, "kind": self.kind}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Command:
        """From its body (run, token and epoch present); ValueError naming a field that is not an integer."""
        run, token, epoch = (_integer(body, name) for name in ("run", "token", "epoch"))
        kind = body.get("kind")
        return cls(epoch, run, token, None if kind is None else str(kind))

    def epoch_kind(self) -> EpochKind:
        """The barrier's kind (a checkpoint when it names none); ValueError naming the kinds otherwise."""
        try:
            return EpochKind(self.kind if self.kind is not None else EpochKind.CHECKPOINT)
        except ValueError:
            raise ValueError(f"kind must be one of {', '.join(EpochKind)}") from None


def _integer(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer")
    return value


@dataclass(frozen=True)
class TaskIdentity:
    """Which task of which run this process is."""

    task_id: str
    run: int
    attempt: str
