"""The compiler's layers on concrete models: policies, chaining, shards, channels, splits."""

from __future__ import annotations

import json

import pytest

from nopstream.plan import compiler
from nopstream.plan.canonical import fingerprint
from nopstream.plan.keys import owner_of_shard
from nopstream.plan.streamgraph import EdgePolicy
from tests.conftest import EXAMPLES, ROOT
from tests.plan.conftest import compile_data, compile_example, linear

WORDCOUNT_PLAN = """\
PartitionedPlan of job 'wordcount' pipeline 'main' (namespace wordcount/main, planVersion 1)
  semanticMode STRICT_EXACTLY_ONCE, stateShardCount 128, hash blake2b64-v1
  fingerprint {fingerprint}
vertices:
  lines: parallelism 2, not keyed, chain [lines -> split -> by-word]
    subtask 0: wordcount/main/lines/0
    subtask 1: wordcount/main/lines/1
  count: parallelism 2, keyed, chain [count]
    subtask 0: wordcount/main/count/0 shards [0, 64)
    subtask 1: wordcount/main/count/1 shards [64, 128)
  out: parallelism 1, not keyed, chain [out]
    subtask 0: wordcount/main/out/0
edges:
  by-word->count: lines -> count HASH by fn 'wordcount:word', 4 channels
  count->out: count -> out SINGLETON, 2 channels
sources:
  lines: splits discovered at run time, hash-mod by blake2b64-v1
checkpoint ACK set: 5 tasks
"""


def test_plan_command_prints_vertices_edges_channels_and_shards(nopstream):
    text = nopstream("plan", "examples/wordcount.yaml")
    doc = json.loads(nopstream("plan", "examples/wordcount.yaml", "--format", "json").out)
    assert text.code == 0
    assert text.out == WORDCOUNT_PLAN.format(fingerprint=doc["fingerprint"])
    assert doc["layer"] == "partitioned"


def test_plan_layers_as_text(nopstream, tmp_path):
    stream = nopstream("plan", "examples/wordcount.yaml", "--layer", "stream").out.splitlines()
    assert "  by-word->count                           HASH by fn 'wordcount:word'" in stream
    assert "  lines->split                             FORWARD" in stream
    job = nopstream("plan", "examples/wordcount.yaml", "--layer", "job").out.splitlines()
    assert "  lines                    parallelism 2    chain [lines -> split -> by-word]" in job
    on_s3 = tmp_path / "wordcount.yaml"
    on_s3.write_text(
        (EXAMPLES / "wordcount.yaml")
        .read_text()
        .replace("{local: {path: .nopstream/checkpoints}}", "{s3: {endpoint: 'http://s3:9000', bucket: cps}}")
    )
    dep = nopstream(
        "plan", str(on_s3), "--layer", "deployment", "--backend", "kubernetes", "--namespace", "streams"
    ).out.splitlines()
    assert "  etcd prefix /nopstream/streams/wordcount/main/" in dep
    assert "  wordcount-count-1                        wordcount/main/count/1 at http://{podIP}:7700" in dep
    local = nopstream("plan", "examples/wordcount.yaml", "--layer", "deployment", "--backend", "local")
    assert "  coordinators: wordcount-coordinator-0" in local.out.splitlines()


@pytest.mark.parametrize("layer", sorted(compiler.LAYERS))
@pytest.mark.parametrize("name", ["wordcount", "windowed", "fraud", "enrichment", "rules"])
def test_json_round_trip_is_exact(name, layer):
    plan = compile_example(name).layer(layer)
    text = compiler.dump_document(plan)
    again = compiler.load_document(text)
    assert again == plan
    assert compiler.dump_document(again) == text
    assert json.loads(text)["fingerprint"] == fingerprint(plan)


def test_a_tampered_document_is_refused():
    text = compiler.dump_document(compile_example("wordcount").partitioned)
    tampered = text.replace('"stateShardCount":128', '"stateShardCount":64')
    with pytest.raises(compiler.ModelError) as err:
        compiler.load_document(tampered, origin="plan.json")
    (issue,) = err.value.issues
    assert issue.path == "plan.json: fingerprint"
    assert issue.rule == "plan-fingerprint"


def test_edge_policy_rules():
    data = linear(
        {"id": "m", "type": "map", "fn": "f:m"},  # 2 -> 2: FORWARD (chained)
        {"id": "wide", "type": "map", "fn": "f:m", "parallelism": 3},  # 2 -> 3: REBALANCE
        {"id": "k", "type": "key_by", "key": {"field": "k"}, "parallelism": 3},  # FORWARD
        {"id": "agg", "type": "aggregate", "aggregate": "count", "parallelism": 4},  # HASH
        {"id": "own", "type": "reduce", "fn": "f:r", "key": {"field": "x"}},  # own key: HASH
        {"id": "bc", "type": "map", "fn": "f:m", "partitioning": "broadcast"},  # BROADCAST
        {"id": "one", "type": "map", "fn": "f:m", "parallelism": 1},  # 2 -> 1: SINGLETON
        {"id": "u", "type": "union", "inputs": ["one", "m"]},  # UNION
    )
    plans = compile_data(data)
    policies = {e.edge_id: e.policy for e in plans.stream.edges}
    assert policies == {
        "src->m": EdgePolicy.FORWARD,
        "m->wide": EdgePolicy.REBALANCE,
        "wide->k": EdgePolicy.FORWARD,
        "k->agg": EdgePolicy.HASH,
        "agg->own": EdgePolicy.HASH,
        "own->bc": EdgePolicy.BROADCAST,
        "bc->one": EdgePolicy.SINGLETON,
        "one->u": EdgePolicy.UNION,
        "m->u": EdgePolicy.UNION,
        "u->out": EdgePolicy.FORWARD,
    }
    keys = {e.edge_id: e.key.describe() for e in plans.stream.edges if e.key}
    assert keys == {"k->agg": "field 'k'", "agg->own": "field 'x'"}
    # m has two consumers (wide, u), so src->m chains but m->wide does not.
    chains = {v.vertex_id: [n.node_id for n in v.chain] for v in plans.job.vertices}
    assert chains == {
        "src": ["src", "m"],
        "wide": ["wide", "k"],
        "agg": ["agg"],
        "own": ["own"],
        "bc": ["bc"],
        "one": ["one"],
        "u": ["u", "out"],
    }


def test_channels_follow_the_policy():
    data = linear(
        {"id": "k", "type": "key_by", "key": {"field": "k"}},
        {"id": "agg", "type": "aggregate", "aggregate": "sum", "parallelism": 3},
        {"id": "one", "type": "map", "fn": "f:m", "parallelism": 1},
        {"id": "u", "type": "union", "inputs": ["one", "src"], "parallelism": 2},
    )
    plan = compile_data(data).partitioned
    chans = {e.edge_id: [(c.upstream, c.downstream) for c in e.channels] for e in plan.edges}
    assert chans == {
        "src->k": [(0, 0), (1, 1)],  # FORWARD, but src has two consumers: not chained
        "k->agg": [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)],
        "agg->one": [(0, 0), (1, 0), (2, 0)],
        "one->u": [(0, 0), (0, 1)],
        "src->u": [(0, 0), (1, 1)],
    }
    edge = next(e for e in plan.edges if e.edge_id == "k->agg")
    assert edge.channel_id(edge.channels[4]) == "k->agg/1/1/0"
    assert [(r.start, r.end) for r in edge.owners or ()] == [(0, 42), (42, 85), (85, 128)]
    assert edge.shard_count == 128 and edge.hash_policy == "blake2b64-v1"


def test_generator_splits_are_assigned_statically():
    data = linear(parallelism=2)
    data["model"]["sinks"][0]["inputs"] = ["src"]
    data["model"]["sources"][0]["config"]["splits"] = 5
    (src,) = compile_data(data).partitioned.sources
    assert src.policy == "static"
    assert src.assignment == (("split-0", "split-2", "split-4"), ("split-1", "split-3"))


def test_shard_owners_cover_every_shard_once():
    plan = compile_example("wordcount").partitioned
    count = plan.vertex("count")
    for shard in range(128):
        owners = [s.index for s in count.subtasks if s.shards and shard in s.shards]
        assert owners == [owner_of_shard(shard, 2, 128)]


def test_default_ids_inputs_and_parallelism():
    data = {
        "jobId": "defaults",
        "parallelism": 3,
        "model": {
            "sources": [{"id": "src", "type": "generator"}],
            "operators": [{"type": "map", "fn": "f:a"}, {"type": "filter", "fn": "f:b", "parallelism": 2}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "o"}}],
        },
    }
    stream = compile_data(data).stream
    assert [(n.node_id, n.parallelism) for n in stream.nodes] == [
        ("src", 3),
        ("operators-0", 3),
        ("operators-1", 2),
        ("out", 3),
    ]
    assert [e.edge_id for e in stream.edges] == [
        "src->operators-0",
        "operators-0->operators-1",
        "operators-1->out",
    ]
    assert stream.identity.checkpoint_namespace == "defaults/main"


def test_side_output_edge():
    plans = compile_example("windowed")
    edges = {e.edge_id: (e.output, e.policy) for e in plans.partitioned.edges}
    assert edges["per-page:late->late-clicks"] == ("late", EdgePolicy.SINGLETON)
    assert edges["per-page->counts"] == ("main", EdgePolicy.FORWARD)


def test_checked_in_examples_are_the_ones_tested():
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == {
        "wordcount.yaml",
        "windowed.yaml",
        "fraud.yaml",
        "enrichment.yaml",
        "rules.yaml",
        "kafka-to-postgres.yaml",
    }
    assert (ROOT / "crds" / "streamjob.yaml").exists()
