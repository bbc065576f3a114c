"""User functions of the card-fraud example (importable as `fraud`)."""

from typing import Any


def is_small(charge: dict[str, Any]) -> bool:
    """A probing charge: under one unit."""
    return float(charge["amount"]) < 1.0


def is_large(charge: dict[str, Any]) -> bool:
    """A charge worth stealing for: 500 units or more."""
    return float(charge["amount"]) >= 500.0


def to_alert(match: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """An alert record from a matched small -> large sequence."""
    small, large = match["small"][0], match["large"][0]
    return {
        "card": small["card"],
        "smallTs": small["ts"],
        "largeTs": large["ts"],
        "amount": large["amount"],
    }
