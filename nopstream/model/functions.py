"""User functions given as Python objects (the builder's callables), recorded as `module:qualname`.

A model names each user function by reference, so that plans, fingerprints and task
processes (which import it by name) never see the object itself. A function or class
passed where a reference is expected becomes its `module:qualname` when that name imports
back to the same object; anything that cannot (a lambda, a function defined inside another)
is refused with what to do instead. A function of the script being run is `__main__:name`:
the processes a local run forks import it, and whatever leaves this process (`main_functions`)
refuses it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any


class NotImportable(ValueError):
    """A function given by object that task processes could not import by name."""


CALLED_WITH: dict[str, tuple[str, ...]] = {
    "map": ("record",),
    "filter": ("record",),
    "flat_map": ("record",),
    "async_map": ("record",),
    "async_flat_map": ("record",),
    "reduce": ("accumulator", "record"),
    "join": ("left", "right"),
    "key": ("record",),
    "timestampFn": ("record",),
    "where": ("record",),
}
"""What each kind of user function is called with (an operator type, or the field naming a function)."""


def arity_issue(fn: Any, kind: str) -> str | None:
    """Why `fn` cannot be called as a function of `kind` is (`CALLED_WITH`), or None (a class, or a
    callable whose signature Python cannot tell, is let be)."""
    called_with = CALLED_WITH.get(kind)
    if called_with is None or isinstance(fn, type) or not callable(fn):
        return None
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*called_with)
    except TypeError:
        return (
            f"{getattr(fn, '__qualname__', fn)!s}{signature} cannot be called as a {kind} function, which"
            f" is called with ({', '.join(called_with)})"
        )
    return None


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


MAIN = "__main__:"
"""The prefix of a function defined in the script being run."""


def main_function_issue(ref: str) -> str:
    """Why a function of the script being run cannot go where other processes import it."""
    return (
        f"'{ref.removeprefix(MAIN)}' is defined in the script being run (__main__), which other processes"
        " cannot import: put it in a module beside the script and import it from there"
    )
