"""The StreamJob CustomResourceDefinition, generated from the pydantic models.

pydantic's JSON schema becomes a structural OpenAPI v3 schema: references are
inlined, `X | None` becomes `nullable`, titles go, free-form mappings keep unknown
fields. `crds/streamjob.yaml` is this function's output; a test keeps them equal.
"""

from __future__ import annotations

from typing import Any

from nopstream.model.load import API_GROUP, KIND
from nopstream.model.spec import StreamModel
from nopstream.model.status import StreamJobStatus

PLURAL = "streamjobs"
VERSION = "v1alpha1"


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            merged = {**_structural(options[0], defs), **_structural(rest, defs)}
            merged["nullable"] = True
            return merged
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "default" and value is None:
            continue
        if key == "additionalProperties" and value is True:
            out["x-kubernetes-preserve-unknown-fields"] = True
            continue
        if key == "additionalProperties" and value is False:
            continue  # forbidden in structural schemas; the API server prunes unknown fields
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
            continue
        out[key] = _structural(value, defs)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _schema_of(cls: type[StreamModel] | type[StreamJobStatus]) -> dict[str, Any]:
    raw = cls.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    return schema


def streamjob_crd() -> dict[str, Any]:
    """The StreamJob CRD as plain data, ready to dump as YAML."""
    spec_schema = _schema_of(StreamModel)
    status_schema = _schema_of(StreamJobStatus)
    status_schema["x-kubernetes-preserve-unknown-fields"] = True
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": "streamjob",
                "shortNames": ["sj"],
                "categories": ["nopstream"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {
                            "name": "Ready",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                        },
                        {"name": "Run", "type": "integer", "jsonPath": ".status.run"},
                        {"name": "Mode", "type": "string", "jsonPath": ".status.semanticMode"},
                        {
                            "name": "Durable",
                            "type": "integer",
                            "jsonPath": ".status.latestDurableEpoch",
                        },
                        # a date column shows its age: how long since an epoch last became durable
                        {"name": "Last-Durable", "type": "date", "jsonPath": ".status.latestDurableAt"},
                        {
                            "name": "Committed",
                            "type": "integer",
                            "jsonPath": ".status.latestCommittedEpoch",
                            "priority": 1,
                        },
                        {"name": "Leader", "type": "string", "jsonPath": ".status.leader.pod", "priority": 1},
                        {
                            "name": "Token",
                            "type": "integer",
                            "jsonPath": ".status.leader.token",
                            "priority": 1,
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A stream-processing job run with exactly-once results.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }
