"""The checked-in CRD equals what `nopstream crd` prints, and its schema is structural."""

from __future__ import annotations

from typing import Any

import yaml

from tests.conftest import ROOT


def test_checked_in_crd_is_current(nopstream):
    result = nopstream("crd")
    assert result.code == 0
    assert (ROOT / "crds" / "streamjob.yaml").read_text() == result.out, (
        "crds/streamjob.yaml is stale: run `nopstream crd > crds/streamjob.yaml`"
    )


def _walk(node: Any, path: str, problems: list[str]) -> None:
    if not isinstance(node, dict):
        return
    if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: no type")
    if node.get("additionalProperties") is False:
        problems.append(f"{path}: additionalProperties false")
    for key in ("$ref", "anyOf", "oneOf", "allOf", "title"):
        if key in node:
            problems.append(f"{path}: {key}")
    for name, sub in node.get("properties", {}).items():
        _walk(sub, f"{path}.{name}", problems)
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]", problems)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}{{}}", problems)


def test_schema_is_structural_and_has_status_and_columns():
    crd = yaml.safe_load((ROOT / "crds" / "streamjob.yaml").read_text())
    assert crd["spec"]["group"] == "nopstream.io"
    assert crd["spec"]["names"]["kind"] == "StreamJob"
    assert crd["spec"]["names"]["shortNames"] == ["sj"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")] == [
        "Phase",
        "Ready",
        "Run",
        "Mode",
        "Durable",
        "Last-Durable",
        "Age",
    ]
    # `kubectl get -o wide` adds the committed epoch and the leading coordinator with its token
    assert [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")] == [
        "Committed",
        "Leader",
        "Token",
    ]
    problems: list[str] = []
    _walk(version["schema"]["openAPIV3Schema"], "", problems)
    assert problems == []
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    ops = spec["properties"]["model"]["properties"]["operators"]["items"]["properties"]
    assert ops["type"]["enum"] == [
        "map",
        "filter",
        "flat_map",
        "async_map",
        "async_flat_map",
        "lookup",
        "key_by",
        "reduce",
        "aggregate",
        "union",
        "window",
        "process",
        "cep",
        "join",
    ]
    assert spec["properties"]["semanticMode"]["default"] == "STRICT_EXACTLY_ONCE"
