"""The builder API yields the same canonical model and plan fingerprints as YAML."""

from __future__ import annotations

from nopstream.model.builder import JobBuilder
from nopstream.model.load import LoadedModel, load_file
from nopstream.model.spec import JoinSpec, KeySpec, PatternStep, WatermarkSpec, WindowSpec, canonical_model
from nopstream.plan import compiler
from nopstream.plan.canonical import fingerprint
from tests.conftest import EXAMPLES


def same_as_example(model, name: str) -> None:
    from_yaml = load_file(EXAMPLES / f"{name}.yaml")
    assert canonical_model(model) == canonical_model(from_yaml.model)
    built = compiler.compile_model(LoadedModel(model, "<builder>", ()))
    expected = compiler.compile_model(from_yaml)
    for layer in compiler.LAYERS:
        assert fingerprint(built.layer(layer)) == fingerprint(expected.layer(layer))


def test_wordcount_both_ways():
    job = JobBuilder(
        "wordcount",
        parallelism=2,
        checkpoint={
            "interval_ms": 1000,
            "retain_latest": 3,
            "storage": {"local": {"path": ".nopstream/checkpoints"}},
        },
    )
    words = job.source("lines", "file", config={"path": "examples/data/wordcount/*.txt", "format": "text"})
    counts = words.flat_map("wordcount:split", id="split").key_by(fn="wordcount:word", id="by-word")
    counts.aggregate("count", id="count", emit="final").sink(
        "out", "file", config={"path": "out/wordcount"}, parallelism=1
    )
    same_as_example(job.build(), "wordcount")


def test_windowed_both_ways():
    job = JobBuilder("page-clicks", parallelism=2)
    clicks = job.source(
        "clicks",
        "file",
        config={"path": "examples/data/clicks/*.jsonl", "format": "jsonl"},
        watermark=WatermarkSpec(timestamp_field="ts", max_out_of_orderness_ms=2000, idle_timeout_ms=5000),
    )
    window = WindowSpec(
        kind="tumbling", time="event", size_ms=10000, allowed_lateness_ms=1000, late_output="late"
    )
    per_page = clicks.window(window, id="per-page", key={"field": "page"}, aggregate="count")
    per_page.sink("counts", "file", config={"path": "out/page-clicks/counts"})
    per_page.side_output("late").sink(
        "late-clicks", "file", config={"path": "out/page-clicks/late"}, parallelism=1
    )
    same_as_example(job.build(), "windowed")


def test_fraud_both_ways():
    job = JobBuilder("card-fraud", parallelism=2)
    charges = job.source(
        "charges",
        "file",
        config={"path": "examples/data/cards/*.jsonl", "format": "jsonl"},
        watermark=WatermarkSpec(timestamp_field="ts", max_out_of_orderness_ms=1000),
    )
    steps = [
        PatternStep(name="small", where="fraud:is_small"),
        PatternStep(name="large", where="fraud:is_large", contiguity="relaxed"),
    ]
    matches = charges.cep(steps, id="small-then-large", within_ms=60000, time="event", key={"field": "card"})
    matches.map("fraud:to_alert", id="alert").sink(
        "alerts", "file", config={"path": "out/card-fraud"}, parallelism=1
    )
    same_as_example(job.build(), "fraud")


def test_enrichment_both_ways():
    job = JobBuilder("enrichment", parallelism=2)
    events = WatermarkSpec(timestamp_field="ts", max_out_of_orderness_ms=2000)
    orders, tiers = (
        job.source(
            name,
            "file",
            config={"path": f"examples/data/enrichment/{name}.jsonl", "format": "jsonl"},
            watermark=events,
        )
        for name in ("orders", "tiers")
    )
    joined = orders.join(
        tiers,
        JoinSpec(kind="temporal", how="left", late_output="late"),
        id="with-tier",
        key=KeySpec(field="customer"),
        fn="enrichment:with_tier",
    )
    joined.sink("enriched", "file", config={"path": "out/enrichment/enriched"})
    joined.side_output("late").sink(
        "late-records", "file", config={"path": "out/enrichment/late"}, parallelism=1
    )
    same_as_example(job.build(), "enrichment")


def test_rules_both_ways():
    job = JobBuilder("rules", parallelism=2)
    events = WatermarkSpec(timestamp_field="ts", max_out_of_orderness_ms=2000)
    transactions = job.source(
        "transactions",
        "file",
        config={"path": "examples/data/rules/transactions.jsonl", "format": "jsonl"},
        watermark=events,
    )
    rules = job.source(
        "rules",
        "file",
        config={"path": "examples/data/rules/rules.jsonl", "format": "jsonl"},
        watermark=events,
        parallelism=1,
    )
    checked = transactions.process(
        "rules:Rules", id="check", key=KeySpec(field="account"), broadcast=(rules,)
    )
    checked.sink("alerts", "file", config={"path": "out/rules/alerts"})
    same_as_example(job.build(), "rules")


def test_async_operators_and_lookups_both_ways():
    from nopstream.model.load import load_data
    from nopstream.model.spec import AsyncSpec, LookupSpec

    job = JobBuilder("lookups", parallelism=2)
    orders = job.source("orders", "file", config={"path": "in/orders.jsonl", "format": "jsonl"})
    scored = orders.async_map("fns:score", settings=AsyncSpec(capacity=50, timeout_ms=500), id="scored")
    tiers = scored.lookup(
        LookupSpec(kind="http", url="http://tiers/{customer}", into="tier"),
        settings=AsyncSpec(retries=2),
        id="tiers",
    )
    tiers.sink("out", "file", config={"path": "out"})
    async_op = {"type": "async_map", "fn": "fns:score", "async": {"capacity": 50, "timeoutMs": 500}}
    lookup = {"kind": "http", "url": "http://tiers/{customer}", "into": "tier"}
    yaml_model = load_data(
        {
            "jobId": "lookups",
            "parallelism": 2,
            "model": {
                "sources": [
                    {"id": "orders", "type": "file", "config": {"path": "in/orders.jsonl", "format": "jsonl"}}
                ],
                "operators": [
                    {"id": "scored", "inputs": ["orders"], **async_op},
                    {
                        "id": "tiers",
                        "type": "lookup",
                        "inputs": ["scored"],
                        "lookup": lookup,
                        "async": {"retries": 2},
                    },
                ],
                "sinks": [{"id": "out", "type": "file", "inputs": ["tiers"], "config": {"path": "out"}}],
            },
        }
    )
    assert canonical_model(job.build()) == canonical_model(yaml_model.model)
