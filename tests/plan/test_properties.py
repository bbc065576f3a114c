"""Property tests over random valid models (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nopstream.model.load import load_data
from nopstream.model.spec import canonical_model
from nopstream.plan import compiler
from nopstream.plan.deployment import resource_name
from nopstream.plan.keys import shard_of
from nopstream.plan.validation.rules import ID_PATTERN, K8S_NAME_PATTERN

STATELESS = ["map", "filter", "flat_map"]


@st.composite
def models(draw: st.DrawFn) -> dict[str, Any]:
    """A random valid bare model: sources, a DAG of operators that only read earlier nodes, sinks."""
    par = st.integers(1, 5)
    shards = draw(st.sampled_from([8, 16, 128]))
    sources = [
        {"id": f"s{i}", "type": "generator", "parallelism": draw(par), "config": {"count": 5}}
        for i in range(draw(st.integers(1, 3)))
    ]
    nodes = [s["id"] for s in sources]
    operators: list[dict[str, Any]] = []
    key_bys: set[str] = set()
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["stateless", "key_by", "keyed", "union"]))
        op: dict[str, Any] = {"id": f"o{i}", "parallelism": draw(par)}
        if kind == "union" and len(nodes) >= 2:
            op.update(
                type="union",
                inputs=draw(st.lists(st.sampled_from(nodes), min_size=2, max_size=3, unique=True)),
            )
        elif kind == "key_by":
            op.update(type="key_by", inputs=[draw(st.sampled_from(nodes))], key={"field": "k"})
            key_bys.add(op["id"])
        elif kind == "keyed":
            source = draw(st.sampled_from(nodes))
            op.update(type="aggregate", inputs=[source], aggregate="sum")
            if source not in key_bys:  # a key_by input already gives the key
                op["key"] = {"fn": "m:f"}
        else:
            op.update(type=draw(st.sampled_from(STATELESS)), inputs=[draw(st.sampled_from(nodes))], fn="m:f")
            hint = draw(st.sampled_from([None, "rebalance", "broadcast"]))
            if hint:
                op["partitioning"] = hint
        operators.append(op)
        nodes.append(op["id"])
    consumed = {i.partition(":")[0] for op in operators for i in op["inputs"]}
    dangling = [n for n in nodes if n not in consumed]
    sinks = [
        {"id": f"k{i}", "type": "file", "inputs": [n], "parallelism": draw(par), "config": {"path": "o"}}
        for i, n in enumerate(dangling)
    ]
    return {
        "jobId": "prop",
        "stateShardCount": shards,
        "model": {"sources": sources, "operators": operators, "sinks": sinks},
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(), st.lists(st.one_of(st.text(max_size=8), st.integers(), st.none()), max_size=20))
def test_compiled_plans_hold_their_invariants(data, keys):
    loaded = load_data(data)
    plans = compiler.compile_model(loaded)
    plan = plans.partitioned

    # compile -> JSON -> load -> compile gives the same fingerprint, at every layer
    again = compiler.compile_model(load_data(canonical_model(loaded.model)))
    for layer in compiler.LAYERS:
        text = compiler.dump_document(plans.layer(layer))
        assert compiler.dump_document(again.layer(layer)) == text
        assert compiler.load_document(text) == plans.layer(layer)

    # every channel joins existing subtasks
    subtasks = {v.vertex_id: {s.index for s in v.subtasks} for v in plan.vertices}
    for e in plan.edges:
        assert e.channels
        for c in e.channels:
            assert c.upstream in subtasks[e.source_vertex]
            assert c.downstream in subtasks[e.target_vertex]
        assert len({e.channel_id(c) for c in e.channels}) == len(e.channels)

    # every key maps to exactly one owner subtask on every HASH edge
    for e in plan.edges:
        if e.owners is None:
            continue
        for key in keys:
            shard = shard_of(key, plan.identity.state_shard_count)
            assert sum(1 for r in e.owners if shard in r) == 1

    # the ACK set is every task
    assert set(plan.ack_set) == set(plan.task_ids())
    assert len(plan.ack_set) == sum(v.parallelism for v in plan.vertices)


IDS = st.from_regex(ID_PATTERN, fullmatch=True)
NAME_TUPLES = st.tuples(IDS, IDS, st.integers(0, 255).map(str)) | st.tuples(
    IDS, st.just("coordinator"), st.integers(0, 2).map(str)
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(NAME_TUPLES, min_size=2, max_size=40, unique=True))
def test_resource_names_are_labels_and_never_shared(tuples: list[tuple[str, ...]]) -> None:
    names = [resource_name(*t) for t in tuples]
    assert all(K8S_NAME_PATTERN.match(n) for n in names)
    assert len(set(names)) == len(names)


def test_resource_names_of_ids_with_dashes_differ_and_plain_ids_read_as_given() -> None:
    assert resource_name("wordcount", "split", "0") == "wordcount-split-0"
    assert resource_name("a-b", "c", "0") != resource_name("a", "b-c", "0")
    assert resource_name("a-b", "c", "0").startswith("a-b-c-0--")
    long = resource_name("j" * 40, "v" * 40, "7")
    assert len(long) == 63 and long.startswith("j" * 40 + "-" + "v" * 10)
