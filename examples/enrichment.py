"""User functions of the enrichment example (importable as `enrichment`)."""

from typing import Any


def with_tier(order: dict[str, Any], tier: dict[str, Any] | None) -> dict[str, Any]:
    """The order with the tier its customer had at the order's time (None before any is known)."""
    return {**order, "tier": tier["tier"] if tier is not None else None}
