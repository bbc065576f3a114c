"""What `nopstream run` checks before it starts anything: the job can run on this machine.

Validation (`plan.validation`) knows the model; this knows the machine: every user
function imports, every file sink and local checkpoint directory can be created and
written, and every file source without discovery has something to read. Each problem
is an `Issue` naming the field, so a run that cannot start says so at once, in one line
per problem, instead of failing (and being retried) inside its tasks.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nopstream import safefiles
from nopstream.model.catalogue import local_directory, local_files
from nopstream.model.errors import Issue
from nopstream.model.functions import arity_issue
from nopstream.model.load import LoadedModel
from nopstream.model.spec import canonical_model
from nopstream.runtime.functions import FunctionError, resolve

FUNCTION_KEYS = ("fn", "where", "timestampFn")
"""The model's fields that name a user function (`module:attribute`)."""


def function_issues(
    loaded: LoadedModel, python_path: Sequence[str], *, absent_ok: bool = False
) -> list[Issue]:
    """An issue for every user function that does not import (with `python_path` first on sys.path).

    With `absent_ok` a function whose module is not on this machine at all is let be
    (`nopstream validate` of a job whose functions live in its image); one that is
    here but broken, or lacks the attribute, is still an issue.
    """
    for entry in reversed(python_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    issues = []
    model = canonical_model(loaded.model)
    for path, ref in function_refs(model, ()):
        if absent_ok and importlib.util.find_spec(ref.partition(":")[0].split(".")[0]) is None:
            continue
        try:
            fn = resolve(ref)
        except FunctionError as exc:
            issues.append(Issue(loaded.path(*path), str(exc), "fn-importable"))
            continue
        except Exception as exc:  # importing user code may raise anything; it is the user's
            issues.append(Issue(loaded.path(*path), f"importing '{ref}' raised {exc!r}", "fn-importable"))
            continue
        problem = arity_issue(fn, _kind(model, path))
        if problem is not None:
            issues.append(Issue(loaded.path(*path), f"'{ref}': {problem}", "fn-arity"))
    return issues


def _kind(model: dict[str, Any], path: tuple[str | int, ...]) -> str:
    """The kind of function at `path` (`functions.CALLED_WITH`): a key selector, the owning operator's
    type for its `fn`, or the field itself (`where`, `timestampFn`)."""
    if "key" in path or "keys" in path:
        return "key"
    if path[-1] != "fn":
        return str(path[-1])
    owner: Any = model
    for part in path[:-1]:
        owner = owner[part]
    return str(owner.get("type", "")) if isinstance(owner, dict) else ""


def function_refs(value: Any, at: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """The path and reference of every user function named in a canonical model."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in FUNCTION_KEYS and isinstance(item, str):
                yield (*at, key), item
            else:
                yield from function_refs(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from function_refs(item, (*at, i))


def machine_issues(loaded: LoadedModel) -> list[Issue]:
    """Directories this run writes that it cannot, and file sources with nothing to read."""
    model = loaded.model
    issues = []
    local = model.checkpoint.storage.local
    if local is not None:
        problem = _unwritable(Path(local.path))
        if problem:
            issues.append(Issue(loaded.path("checkpoint", "storage", "local", "path"), problem, "writable"))
    for i, sink in enumerate(model.graph.sinks):
        if (directory := local_directory(sink.type, sink.config)) is not None:
            key, path = directory
            problem = _unwritable(Path(path))
            if problem:
                issues.append(Issue(loaded.path("model", "sinks", i, "config", key), problem, "writable"))
    for i, source in enumerate(model.graph.sources):
        files = local_files(source.type, source.config)
        # a source that discovers files as they come may rightly find none at the start
        if files is not None and source.config.get("discoveryIntervalMs") is None:
            key, pattern = files
            problem = _unreadable_glob(pattern)
            if problem:
                issues.append(Issue(loaded.path("model", "sources", i, "config", key), problem, "readable"))
    return issues


def _unwritable(directory: Path) -> str | None:
    """Why this process cannot create and write files in `directory`, or may not (another user could
    redirect them: `safefiles.untrusted`), or None."""
    existing = directory
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing != directory and not existing.is_dir():
        return f"'{directory}' cannot be created: '{existing}' is a file"
    if existing == directory and not directory.is_dir():
        return f"'{directory}' is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"'{existing}' is not writable"
    why = safefiles.untrusted(existing)
    if why is not None:
        return f"'{directory}' is not safe to write: {why} (rule: docs/security.md)"
    return None


def _unreadable_glob(pattern: str) -> str | None:
    """Why a file source without discovery would read nothing at all, or None."""
    if Path(pattern).is_dir():
        return f"'{pattern}' is a directory: name its files (e.g. '{pattern.rstrip('/')}/*.txt')"
    matches = glob.glob(pattern, recursive=True)
    if not any(Path(m).is_file() for m in matches):
        return f"'{pattern}' matches no file (a source that should wait for files sets discoveryIntervalMs)"
    unreadable = next((m for m in matches if Path(m).is_file() and not os.access(m, os.R_OK)), None)
    if unreadable is not None:
        return f"'{unreadable}' is not readable"
    return None
