"""User functions given as Python objects (the builder's callables), recorded as `module:qualname`.

A model names each user function by reference, so that plans, fingerprints and task
processes (which import it by name) never see the object itself. A function or class
passed where a reference is expected becomes its `module:qualname` when that name imports
back to the same object; anything that cannot (a lambda, a function defined inside another,
one defined in the script being run) is refused with what to do instead.
"""

from __future__ import annotations

import importlib
from typing import Any


class NotImportable(ValueError):
    """A function given by object that task processes could not import by name."""


def reference(fn: Any) -> Any:
    """A callable as its `module:qualname`; a string (or anything not callable) as it is, for the
    model's own types to judge."""
    if isinstance(fn, str) or not callable(fn):
        return fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise NotImportable(
            f"{fn!r} has no module and name to import it by: pass a function or class defined at the top"
            " level of a module"
        )
    if "<lambda>" in qualname:
        raise NotImportable(
            f"a lambda ({module}) has no name to import it by: define it with def at the top level of a"
            " module"
        )
    if "<locals>" in qualname:
        raise NotImportable(
            f"'{qualname}' ({module}) is defined inside a function: task processes import functions by"
            " name, so define it at the top level of a module"
        )
    if module == "__main__":
        raise NotImportable(
            f"'{qualname}' is defined in the script being run (__main__), which task processes cannot"
            " import: put it in a module beside the script and import it from there"
        )
    found: Any = None
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        found = None
    if found is not fn:
        raise NotImportable(
            f"'{module}:{qualname}' does not import back to the object given (made at run time, or"
            " wrapped by a decorator that hides its name?): pass a module-level function or class"
        )
    return f"{module}:{qualname}"
