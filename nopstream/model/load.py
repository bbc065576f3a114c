"""Reading a StreamModel from YAML or JSON: a whole StreamJob manifest or a bare model.

Shape errors from pydantic become `Issue`s with the same field paths the validator
uses (`spec.model.operators[2].type`), so a user sees one style of message.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nopstream.model.errors import Issue, ModelError, format_path
from nopstream.model.spec import StreamModel

API_GROUP = "nopstream.io"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "StreamJob"

_PYDANTIC_RULES = {
    "missing": ("required field is missing", "required"),
    "extra_forbidden": ("unknown field", "known-fields"),
}


@dataclass(frozen=True)
class LoadedModel:
    """A parsed model, where it came from, and the path prefix of its fields."""

    model: StreamModel
    origin: str
    prefix: tuple[str, ...]

    def path(self, *parts: str | int) -> str:
        """The user-facing path of a field of the model, e.g. `spec.model.sources[0]`."""
        return format_path((*self.prefix, *parts))


MAX_FILE_BYTES = 1 << 20
"""The largest job file read (a Kubernetes object is at most 1.5 MiB; a real job is a few KiB)."""


def load_file(path: str | Path) -> LoadedModel:
    """Read and parse a model file; raise `ModelError` naming the file or field on bad input.

    Only a regular file of at most MAX_FILE_BYTES is read: `/dev/zero` was read until
    memory ran out, and a FIFO hung.
    """
    p = Path(path)
    try:
        if not stat.S_ISREG(p.stat().st_mode):
            raise ModelError([Issue(str(p), "is not a regular file", "file-readable")])
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ModelError([Issue(str(p), f"is larger than {MAX_FILE_BYTES:,} bytes", "file-readable")])
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ModelError([Issue(str(p), "no such file", "file-exists")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError([Issue(str(p), f"cannot read: {exc}", "file-readable")]) from None
    return load_text(text, origin=str(p))


MAX_DEPTH = 64
"""How deeply a job file may nest (a real one nests about ten levels)."""


class _Refused(yaml.MarkedYAMLError):
    """A document the loader refuses: a key given twice, or nesting past MAX_DEPTH."""

    def __init__(self, problem: str, mark: Any, rule: str) -> None:
        super().__init__(None, None, problem, mark)
        self.rule = rule


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys (the last would win silently) and deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", mark, "nesting-depth")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise _Refused(f"key '{key}' is given twice", key_node.start_mark, "duplicate-key")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_text(text: str, *, origin: str = "<input>") -> LoadedModel:
    """Parse YAML or JSON text holding a StreamJob manifest or a bare StreamModel."""
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects
    except _Refused as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        raise ModelError([Issue(origin, f"{where}{exc.problem}", exc.rule)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ModelError([Issue(origin, f"{where}{problem}", "yaml-syntax")]) from None
    return load_data(data, origin=origin)


def load_data(data: Any, *, origin: str = "<input>") -> LoadedModel:
    """Build a StreamModel from parsed plain data (manifest or bare model)."""
    if not isinstance(data, dict):
        raise ModelError([Issue(origin, "must be a mapping (a StreamJob or a StreamModel)", "shape")])
    if "kind" in data or "apiVersion" in data:
        return _from_manifest(data, origin)
    model = _parse(data, prefix=())
    if model.job_id is None:
        raise ModelError([Issue("jobId", "required in a bare StreamModel file", "job-id")])
    return LoadedModel(model, origin, ())


def _from_manifest(data: dict[str, Any], origin: str) -> LoadedModel:
    issues: list[Issue] = []
    if data.get("apiVersion") != API_VERSION:
        issues.append(Issue("apiVersion", f"must be '{API_VERSION}'", "api-version"))
    if data.get("kind") != KIND:
        issues.append(Issue("kind", f"must be '{KIND}'", "kind"))
    metadata = data.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        issues.append(Issue("metadata.name", "required field is missing", "required"))
    spec = data.get("spec")
    if not isinstance(spec, dict):
        issues.append(Issue("spec", "must be a mapping", "shape"))
    if issues or not isinstance(spec, dict) or not isinstance(name, str):
        raise ModelError(issues)
    model = _parse(spec, prefix=("spec",))
    if model.job_id is None:
        model = model.model_copy(update={"job_id": name})
    return LoadedModel(model, origin, ("spec",))


def _parse(data: dict[str, Any], *, prefix: tuple[str, ...]) -> StreamModel:
    try:
        return StreamModel.model_validate(data)
    except ValidationError as exc:
        raise ModelError(pydantic_issues(exc, prefix)) from None


def pydantic_issues(exc: ValidationError, prefix: tuple[str | int, ...]) -> list[Issue]:
    """pydantic's errors as Issues under a field path prefix, in the model's words."""
    issues = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        schema_text = err["msg"].replace("Input should be", "must be", 1)
        message, rule = _PYDANTIC_RULES.get(err["type"], (schema_text, "schema"))
        issues.append(Issue(format_path((*prefix, *loc)), message, rule))
    return sorted(set(issues))
