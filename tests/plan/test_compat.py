"""The compatibility verdict of a spec change, rule by rule, and the CLI's diff."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from nopstream.plan.compat import ChangeKind, check_compatibility
from tests.conftest import EXAMPLES
from tests.plan.conftest import compile_data


def wordcount() -> dict[str, Any]:
    """The word-count example as a bare model (plain data)."""
    manifest = yaml.safe_load((EXAMPLES / "wordcount.yaml").read_text())
    return {"jobId": "wordcount", **manifest["spec"]}


def verdict(change: Any, **kwargs: Any):
    old = wordcount()
    new = copy.deepcopy(old)
    change(new)
    return check_compatibility(
        compile_data(old).partitioned, compile_data(new).partitioned, drop_state=new.get("dropState", ())
    )


def ops(m: dict[str, Any]) -> list[dict[str, Any]]:
    return m["model"]["operators"]


def test_same_spec_is_ignored():
    v = verdict(lambda m: None)
    assert (v.change, v.reasons) == (ChangeKind.IGNORE, ())


def test_checkpoint_interval_is_not_a_plan_change():
    v = verdict(lambda m: m["checkpoint"].update(intervalMs=5000))
    assert v.change is ChangeKind.IGNORE


def test_parallelism_change_is_a_rescale_with_shard_moves():
    def change(m):
        m["parallelism"] = 3

    v = verdict(change)
    assert v.change is ChangeKind.RESCALE
    assert [str(r) for r in v.reasons] == [
        "RESCALE [rescale] source 'lines' (file) parallelism 2 -> 3:"
        " splits are reassigned from the restored enumerator state",
        "RESCALE [rescale] operator 'split' (flat_map) parallelism 2 -> 3: stateless",
        "RESCALE [rescale] operator 'by-word' (key_by) parallelism 2 -> 3: stateless",
        "RESCALE [rescale] operator 'count' (aggregate) parallelism 2 -> 3:"
        " shard owners move; keyed payloads are not rewritten",
    ]


def test_a_generator_rescaled_keeps_its_splits_or_is_refused():
    def generated(splits):
        def change(m):
            m["model"]["sources"][0] = {"id": "lines", "type": "generator", "config": {"splits": splits}}

        return change

    def rescaled(splits):
        def change(m):
            generated(splits)(m)
            m["parallelism"] = 3

        return change

    old, new = wordcount(), wordcount()
    generated(None)(old)
    rescaled(None)(new)
    v = check_compatibility(compile_data(old).partitioned, compile_data(new).partitioned)
    assert v.change is ChangeKind.REFUSED
    assert [str(r) for r in v.reasons if r.kind is ChangeKind.REFUSED] == [
        "REFUSED [source-splits] source 'lines' would read 3 splits instead of 2: its cursors belong to"
        " those 2 (set config.splits to 2 to rescale it)"
    ]
    generated(4)(old)
    rescaled(4)(new)
    v = check_compatibility(compile_data(old).partitioned, compile_data(new).partitioned)
    assert v.change is ChangeKind.RESCALE


def test_new_stateless_operator_is_an_upgrade():
    def change(m):
        ops(m).insert(1, {"id": "lower", "type": "map", "inputs": ["split"], "fn": "text:lower"})
        ops(m)[2]["inputs"] = ["lower"]

    v = verdict(change)
    assert v.change is ChangeKind.UPGRADE
    assert "UPGRADE [operator-added] operator 'lower' (map) is added" in [str(r) for r in v.reasons]


def test_changed_key_selector_is_refused():
    v = verdict(lambda m: ops(m)[1].update(key={"field": "word"}))
    assert v.change is ChangeKind.REFUSED
    (reason,) = [r for r in v.reasons if r.kind is ChangeKind.REFUSED]
    assert reason.rule == "key-selector" and reason.operator_id == "count"
    assert reason.message == (
        "operator 'count' (aggregate) key selector fn 'wordcount:word' -> field 'word':"
        " keyed state would be found under the wrong keys"
    )


def test_removed_stateful_operator_is_refused_unless_dropped():
    def remove(m):
        del ops(m)[1:]
        m["model"]["sinks"][0]["inputs"] = ["split"]

    v = verdict(remove)
    assert v.change is ChangeKind.REFUSED
    assert [str(r) for r in v.reasons if r.kind is ChangeKind.REFUSED] == [
        "REFUSED [removed-stateful-operator] operator 'count' (aggregate) is removed but has state;"
        " list it in dropState to discard that state"
    ]

    def remove_and_drop(m):
        remove(m)
        m["dropState"] = ["count"]

    v = verdict(remove_and_drop)
    assert v.change is ChangeKind.UPGRADE
    assert (
        "UPGRADE [state-dropped] operator 'count' (aggregate) is removed and its state is dropped (dropState)"
        in [str(r) for r in v.reasons]
    )


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        (lambda m: m.update(stateShardCount=256), "state-shard-count"),
        (lambda m: m.update(pipelineId="other"), "lineage"),
        (lambda m: m.update(checkpointNamespace="x/y"), "lineage"),
        (
            lambda m: (ops(m)[2].update(id="count2"), m["model"]["sinks"][0].update(inputs=["count2"])),
            "removed-stateful-operator",
        ),
        (lambda m: ops(m)[2].update(aggregate="sum"), "state-layout"),
        (lambda m: ops(m)[2].update(stateVersion=2), "state-schema"),
        (lambda m: m["model"]["sinks"][0].update(type="s3", config={"bucket": "bkt"}), "sink-protocol"),
    ],
)
def test_refusals_name_their_rule(change, rule):
    v = verdict(change)
    assert v.change is ChangeKind.REFUSED
    assert rule in {r.rule for r in v.reasons if r.kind is ChangeKind.REFUSED}


def test_diff_command_prints_diff_and_verdict(nopstream, tmp_path):
    new = wordcount()
    new["parallelism"] = 4
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump(new))
    result = nopstream("diff", "examples/wordcount.yaml", str(path))
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == f"plan diff examples/wordcount.yaml -> {path}:"
    assert "  vertex 'count': parallelism 2 -> 4" in lines
    assert "  vertex 'count': subtask 1 owns shards [32, 64) (was [64, 128))" in lines
    assert "  vertex 'count': subtask 3 owns shards [96, 128) (was none)" in lines
    assert "  edge 'by-word->count': channels 4 -> 16" in lines
    assert "verdict: RESCALE" in lines

    new["model"]["operators"][1]["key"] = {"field": "w"}
    path.write_text(yaml.safe_dump(new))
    refused = nopstream("diff", "examples/wordcount.yaml", str(path))
    assert refused.code == 1
    assert "verdict: REFUSED" in refused.out.splitlines()
    assert "  edge 'by-word->count': key fn 'wordcount:word' -> field 'w'" in refused.out.splitlines()


def test_diff_of_the_other_layers_names_fields_by_path():
    from nopstream.plan.diff import diff

    old, new = wordcount(), wordcount()
    new["parallelism"] = 3
    new["image"] = "registry.local/wc:2"
    a, b = compile_data(old), compile_data(new)
    stream = diff(a.stream, b.stream)
    assert "nodes['count'].parallelism: 2 -> 3" in stream
    assert "nodes['count'].spec.parallelism: 2 -> 3" in stream
    deployment = diff(a.deployment, b.deployment)
    assert "image: 'nopstream/runtime:0.1.0' -> 'registry.local/wc:2'" in deployment
    assert "tasks['wordcount/main/count/2'] added" in deployment
    assert diff(a.job, a.job) == []
