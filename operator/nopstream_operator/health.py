"""Status that tells the truth: Ready from epochs that keep becoming durable; Progressing and Degraded.

`Ready` is True only while the run's tasks are all ready **and** epochs keep becoming
durable: the latest durable epoch (or, before the run's first, the moment the run
became ready) is at most one checkpoint interval plus one checkpoint timeout old. An
epoch is triggered at most an interval after the last and is aborted past its
timeout, so a job past that bound has had an epoch fail or hang: Ready=False,
reason `EpochsStalled`, until one becomes durable again (or a recovery starts a run
that makes one). `Progressing` and `Degraded` follow from the phase and Ready on every
status write, as GitOps tools (Argo CD, Flux's kstatus) read them.
"""

from __future__ import annotations

import datetime

from nopstream.model.status import Condition, ConditionStatus, Phase, StreamJobStatus
from nopstream.plan.deployment import CheckpointSettings

STALLED = "EpochsStalled"
_PROGRESSING: frozenset[str] = frozenset({"Pending", "Recovering", "Upgrading"})
_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def now_ms() -> int:
    """The operator's wall clock in milliseconds."""
    return int(datetime.datetime.now(datetime.UTC).timestamp() * 1000)


def rfc3339(ms: int) -> str:
    """A time in milliseconds as the API writes times (seconds, UTC)."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime(_FORMAT)


def _ms(text: str) -> int:
    parsed = datetime.datetime.strptime(text, _FORMAT).replace(tzinfo=datetime.UTC)
    return int(parsed.timestamp() * 1000)


def _ready_since(conditions: list[Condition]) -> int | None:
    """When the current run became ready (Progressing last turned False), in ms; None while it is not."""
    progressing = next((c for c in conditions if c.type == "Progressing"), None)
    if progressing is None or progressing.status != "False" or not progressing.last_transition_time:
        return None
    return _ms(progressing.last_transition_time)


def stalled(
    checkpoint: CheckpointSettings, conditions: list[Condition], durable_at: int | None, *, now: int
) -> bool:
    """Whether no epoch became durable for longer than the bound (interval + timeout) in this run.

    Measured from the later of the latest durable epoch and the run's becoming ready: a
    recovery's new run is not judged by the old run's last epoch.
    """
    started = _ready_since(conditions)
    since = max(now if started is None else started, durable_at or 0)
    return now - since > checkpoint.interval_ms + checkpoint.timeout_ms


def committed_since_ready(status: StreamJobStatus) -> bool:
    """Whether an epoch was committed since the current run became ready (its first output is out)."""
    started = _ready_since(status.conditions)
    committed = status.latest_committed_at
    return started is not None and committed is not None and _ms(committed) >= started


def stalled_message(checkpoint: CheckpointSettings, durable: int | None) -> str:
    """Why Ready is False while a run's epochs do not become durable (no figure that changes each pass)."""
    bound = (checkpoint.interval_ms + checkpoint.timeout_ms) / 1000
    latest = f"epoch {durable}" if durable is not None else "none yet"
    return (
        f"no epoch became durable for longer than {bound:g} s (checkpoint interval + timeout);"
        f" the latest durable is {latest}"
    )


def health(conditions: list[Condition], phase: Phase | None) -> list[tuple[str, ConditionStatus, str, str]]:
    """Progressing and Degraded for this phase and Ready: (type, status, reason, message) each."""
    by_type = {c.type: c for c in conditions}
    ready, valid = by_type.get("Ready"), by_type.get("Valid")
    said = (ready.message if ready is not None else None) or ""
    shown = phase or "Pending"
    progressing: ConditionStatus = "True" if shown in _PROGRESSING else "False"
    degraded: tuple[ConditionStatus, str, str]
    if phase == "Invalid":
        degraded = ("True", "ValidationFailed", (valid.message if valid is not None else None) or "")
    elif phase == "Failed":
        degraded = ("True", (ready.reason if ready is not None else None) or "Failed", said)
    elif ready is not None and ready.reason == STALLED:
        degraded = ("True", STALLED, said)
    else:
        degraded = ("False", "AsExpected", "")
    return [
        ("Progressing", progressing, shown, said if progressing == "True" else ""),
        ("Degraded", *degraded),
    ]
