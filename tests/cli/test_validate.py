"""`nopstream validate`: each validation family gives its exact message and exit code 1."""

from __future__ import annotations

import pytest

from tests.conftest import EXAMPLES

FAMILIES = {
    "unknown-input": [
        "spec.model.operators[2].inputs[0]: unknown node 'lines2' (rule: inputs-exist)",
    ],
    "duplicate-id": [
        "spec.model.operators[1].id: duplicate id 'split' (first used at spec.model.operators[0])"
        " (rule: unique-ids)",
    ],
    "cycle": [
        "spec.model.operators[1].inputs[0]: cycle: both <- upper <- both (rule: acyclic)",
    ],
    "parallelism": [
        "spec.model.sources[0].parallelism: must be at least 1, got 0 (rule: positive)",
    ],
    "keyed-without-key": [
        "spec.model.operators[1].key: keyed operator 'count' (aggregate) needs a key:"
        " set 'key' or read from a key_by (rule: key-required)",
    ],
    "stateful-without-id": [
        "spec.model.operators[1].id: a stateful operator (aggregate) needs an explicit id:"
        " its state is found by it (rule: explicit-id)",
    ],
    "window-without-time": [
        "spec.model.operators[0].window.time: a window needs a time characteristic:"
        " 'event' or 'processing' (rule: window-time)",
    ],
    "strict-sink": [
        "spec.model.sinks[0].type: sink 'console' (stdout) is AT_LEAST_ONCE; semanticMode"
        " STRICT_EXACTLY_ONCE needs OUTBOX_EPOCH_LOG, STAGED_ATOMIC_COMMIT or TWO_PHASE_COMMIT"
        " (rule: semantic-mode)",
    ],
    "connector": [
        "spec.model.sinks[0].config.bucket: required field is missing (rule: required)",
        "spec.model.sinks[0].config.region: unknown field (rule: known-fields)",
        "spec.model.sources[0].type: unknown source type 'kinesis'"
        " (known: collection, file, generator, kafka, postgres-cdc, s3) (rule: connector-type)",
    ],
    "shape": [
        "spec.model.operators[0].type: must be 'map', 'filter', 'flat_map', 'async_map', 'async_flat_map',"
        " 'lookup', 'key_by', 'reduce', 'aggregate', 'union', 'window', 'process', 'cep' or 'join'"
        " (rule: schema)",
        "spec.model.sources[0].paralelism: unknown field (rule: known-fields)",
        "spec.stateShardCount: must be a valid integer (rule: schema)",
    ],
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_reports_its_exact_message(nopstream, family):
    result = nopstream("validate", str(EXAMPLES / "invalid" / f"{family}.yaml"))
    expected = [f"invalid: {len(FAMILIES[family])} issue(s)"] + [f"  {m}" for m in FAMILIES[family]]
    assert result.err.splitlines() == expected
    assert result.out == ""
    assert result.code == 1


def test_every_invalid_example_has_a_test():
    assert {p.stem for p in (EXAMPLES / "invalid").glob("*.yaml")} == set(FAMILIES)


@pytest.mark.parametrize(
    "name", ["wordcount", "windowed", "fraud", "enrichment", "rules", "kafka-to-postgres"]
)
def test_examples_are_valid(nopstream, name):
    result = nopstream("validate", str(EXAMPLES / f"{name}.yaml"))
    assert result.code == 0, result.err
    assert result.out.startswith(f"{EXAMPLES / name}.yaml: valid StreamModel of job ")


def test_missing_file_is_invalid_input(nopstream, tmp_path):
    result = nopstream("validate", str(tmp_path / "nope.yaml"))
    assert result.code == 1
    assert result.err.splitlines()[1] == f"  {tmp_path / 'nope.yaml'}: no such file (rule: file-exists)"


def test_yaml_syntax_error_names_line_and_column(nopstream, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec:\n  model: [\n    sources\n  foo: }\n")
    result = nopstream("validate", str(bad))
    assert result.code == 1
    assert result.err.splitlines()[1] == (
        f"  {bad}: line 4 column 6: expected ',' or ']', but got ':' (rule: yaml-syntax)"
    )


def test_bare_model_needs_job_id(nopstream, tmp_path):
    bare = tmp_path / "bare.yaml"
    bare.write_text(
        "model: {sources: [{id: s, type: generator}], sinks: [{id: o, type: file, config: {path: o}}]}\n"
    )
    result = nopstream("validate", str(bare))
    assert result.code == 1
    assert result.err.splitlines()[1] == "  jobId: required in a bare StreamModel file (rule: job-id)"
    bare.write_text("jobId: bare\n" + bare.read_text())
    assert nopstream("validate", str(bare)).code == 0


def test_manifest_header_errors_are_reported_together(nopstream, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: 3\n")
    result = nopstream("validate", str(bad))
    assert result.code == 1
    assert result.err.splitlines() == [
        "invalid: 4 issue(s)",
        "  apiVersion: must be 'nopstream.io/v1alpha1' (rule: api-version)",
        "  kind: must be 'StreamJob' (rule: kind)",
        "  metadata.name: required field is missing (rule: required)",
        "  spec: must be a mapping (rule: shape)",
    ]


def test_usage_errors_exit_2(nopstream):
    assert nopstream().code == 2
    assert nopstream("validate").code == 2
    assert nopstream("plan", "x.yaml", "--layer", "nope").code == 2
    assert nopstream("frobnicate").code == 2


def test_json_input_is_accepted(nopstream, tmp_path):
    import json

    import yaml

    manifest = yaml.safe_load((EXAMPLES / "wordcount.yaml").read_text())
    path = tmp_path / "wordcount.json"
    path.write_text(json.dumps(manifest))
    yaml_fp = nopstream("validate", str(EXAMPLES / "wordcount.yaml")).out.splitlines()[1]
    result = nopstream("validate", str(path))
    assert result.code == 0
    assert result.out.splitlines()[1] == yaml_fp
