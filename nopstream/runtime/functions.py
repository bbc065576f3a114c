"""User functions: `module:attribute` references resolved by import."""

from __future__ import annotations

import importlib
from typing import Any


class FunctionError(LookupError):
    """A user function reference that cannot be imported."""


def resolve(ref: str) -> Any:
    """The object named by `module:attribute` (attribute may be dotted)."""
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise FunctionError(f"cannot import user function '{ref}': {exc}") from None
    return obj
