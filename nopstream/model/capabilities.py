"""Semantic modes and the delivery capabilities that sources and sinks declare.

The table `ALLOWED` is the whole rule of DESIGN.md section 5: which source and sink
capabilities each semantic mode accepts. The compiler checks it; connectors declare
their capability against the same enums.
"""

from __future__ import annotations

from enum import StrEnum


class SemanticMode(StrEnum):
    """The end-to-end guarantee a job asks for; anything below strict is explicit."""

    STRICT_EXACTLY_ONCE = "STRICT_EXACTLY_ONCE"
    EFFECTIVELY_ONCE = "EFFECTIVELY_ONCE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"
    BEST_EFFORT = "BEST_EFFORT"


class SourceCapability(StrEnum):
    """What a source can promise about re-reading after a failure."""

    REPLAYABLE = "REPLAYABLE"
    TRANSACTIONAL_READ = "TRANSACTIONAL_READ"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"
    BEST_EFFORT = "BEST_EFFORT"


class SinkCapability(StrEnum):
    """How a sink makes its output visible relative to durable epochs."""

    TWO_PHASE_COMMIT = "TWO_PHASE_COMMIT"
    STAGED_ATOMIC_COMMIT = "STAGED_ATOMIC_COMMIT"
    OUTBOX_EPOCH_LOG = "OUTBOX_EPOCH_LOG"
    IDEMPOTENT = "IDEMPOTENT"
    UPSERT_BY_KEY = "UPSERT_BY_KEY"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"
    BEST_EFFORT = "BEST_EFFORT"


_EXACT_SOURCES = frozenset({SourceCapability.REPLAYABLE, SourceCapability.TRANSACTIONAL_READ})
_STRICT_SINKS = frozenset(
    {
        SinkCapability.TWO_PHASE_COMMIT,
        SinkCapability.STAGED_ATOMIC_COMMIT,
        SinkCapability.OUTBOX_EPOCH_LOG,
    }
)
_EFFECTIVE_SINKS = _STRICT_SINKS | {SinkCapability.IDEMPOTENT, SinkCapability.UPSERT_BY_KEY}

ALLOWED: dict[SemanticMode, tuple[frozenset[SourceCapability], frozenset[SinkCapability]]] = {
    SemanticMode.STRICT_EXACTLY_ONCE: (_EXACT_SOURCES, _STRICT_SINKS),
    SemanticMode.EFFECTIVELY_ONCE: (_EXACT_SOURCES, _EFFECTIVE_SINKS),
    SemanticMode.AT_LEAST_ONCE: (
        _EXACT_SOURCES | {SourceCapability.AT_LEAST_ONCE},
        frozenset(SinkCapability) - {SinkCapability.BEST_EFFORT},
    ),
    SemanticMode.BEST_EFFORT: (frozenset(SourceCapability), frozenset(SinkCapability)),
}
