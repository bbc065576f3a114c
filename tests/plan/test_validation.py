"""Validation rules not covered by the example files: all issues at once, effectively-once."""

from __future__ import annotations

import pytest

from nopstream.model import catalogue, connectors
from nopstream.model.capabilities import SinkCapability
from nopstream.model.errors import ModelError
from nopstream.model.load import load_data
from nopstream.plan.validation import validate
from tests.plan.conftest import linear


def messages(data) -> list[str]:
    return [str(i) for i in validate(load_data(data))]


def test_all_issues_are_reported_at_once():
    data = linear(
        {"id": "Bad_Id", "type": "map", "fn": "nocolon"},
        {
            "id": "w",
            "type": "window",
            "key": {"field": "k", "fn": "m:f"},
            "window": {"kind": "sliding", "sizeMs": 0},
        },
        parallelism=0,
    )
    assert messages(data) == [
        "model.operators[0].fn: 'nocolon' is not a function reference of the form 'module:attribute'"
        " (rule: fn-format)",
        "model.operators[0].id: 'Bad_Id' is not a valid id: lower-case letters, digits and '-', 1 to 40"
        " characters, starting and ending with a letter or digit (rule: id-format)",
        "model.operators[1]: a window needs exactly one of 'aggregate' or 'fn' (a function over the window's"
        " records) (rule: one-of)",
        "model.operators[1].key: needs exactly one of 'field' or 'fn' (rule: one-of)",
        "model.operators[1].window.sizeMs: a sliding window needs sizeMs of at least 1 (rule: window-size)",
        "model.operators[1].window.slideMs: a sliding window needs slideMs of at least 1 (rule: window-size)",
        "model.operators[1].window.time: a window needs a time characteristic: 'event' or 'processing'"
        " (rule: window-time)",
        "parallelism: must be at least 1, got 0 (rule: positive)",
    ]


def test_event_time_needs_a_watermark_and_keyed_parallelism_fits_the_shards():
    data = linear(
        {
            "id": "w",
            "type": "window",
            "key": {"field": "k"},
            "aggregate": "count",
            "parallelism": 9,
            "window": {"kind": "session", "gapMs": 5, "time": "event"},
        },
        stateShardCount=8,
    )
    assert messages(data) == [
        "model.operators[0].parallelism: keyed operator parallelism 9 exceeds stateShardCount 8"
        " (rule: shards-per-subtask)",
        "model.operators[0].window.time: event time needs a watermark strategy on source 'src'"
        " (rule: event-time-watermarks)",
    ]


def test_forward_needs_equal_parallelism_and_fields_must_apply():
    data = linear(
        {
            "id": "m",
            "type": "map",
            "fn": "m:f",
            "parallelism": 3,
            "partitioning": "forward",
            "window": {"kind": "tumbling", "sizeMs": 1, "time": "event"},
        }
    )
    assert messages(data) == [
        "model.operators[0].partitioning: forward needs equal parallelism, but 'src' has 2 and 'm' has 3"
        " (rule: forward-parallelism)",
        "model.operators[0].window: not used by an operator of type map (rule: field-applies)",
    ]


@pytest.fixture
def idempotent_sink(monkeypatch):
    """A catalogue entry for an IDEMPOTENT sink type: only the rule is under test, no sink runs."""
    entry = catalogue.SinkType("kv", SinkCapability.IDEMPOTENT, connectors.StdoutSinkConfig)
    monkeypatch.setitem(catalogue.SINK_TYPES, "kv", entry)


def test_idempotent_sinks_need_effectively_once(idempotent_sink):
    data = linear()
    data["model"]["sinks"] = [{"id": "kv", "type": "kv", "inputs": ["src"]}]
    assert messages(data) == [
        "model.sinks[0].type: sink 'kv' (kv) is IDEMPOTENT; semanticMode STRICT_EXACTLY_ONCE needs"
        " OUTBOX_EPOCH_LOG, STAGED_ATOMIC_COMMIT or TWO_PHASE_COMMIT (rule: semantic-mode)"
    ]
    data["semanticMode"] = "EFFECTIVELY_ONCE"
    assert messages(data) == []


def test_at_least_once_sink_is_accepted_when_chosen_explicitly():
    data = linear(semanticMode="AT_LEAST_ONCE")
    data["model"]["sinks"] = [{"id": "console", "type": "stdout", "inputs": ["src"]}]
    assert messages(data) == []


def two_inputs(**process) -> dict:
    data = linear({"id": "p", "type": "process", "inputs": ["src", "other"], "fn": "m:P", **process})
    data["model"]["sources"].append({"id": "other", "type": "generator", "config": {"count": 10}})
    return data


def test_a_process_of_several_inputs_takes_one_key_per_input_or_one_for_all():
    assert messages(two_inputs(keys=[{"field": "a"}, {"fn": "m:b"}])) == []
    assert messages(two_inputs(key={"field": "a"})) == []
    assert messages(
        two_inputs(key={"field": "a"}, keys=[{"field": "a"}, {"field": "b", "fn": "m:f"}, {}])
    ) == [
        "model.operators[0].keys: one key per input: 2 input(s), 3 key(s) (rule: keys-per-input)",
        "model.operators[0].keys: set 'key' (one for every input) or 'keys' (one per input), not both"
        " (rule: one-of)",
        "model.operators[0].keys[1]: needs exactly one of 'field' or 'fn' (rule: one-of)",
        "model.operators[0].keys[2]: needs exactly one of 'field' or 'fn' (rule: one-of)",
    ]
    assert messages(two_inputs()) == [
        "model.operators[0].key: keyed operator 'p' (process) needs a key: set 'key', or 'keys' (one per"
        " input), or read from a key_by (rule: key-required)"
    ]
    data = linear({"id": "m", "type": "map", "fn": "m:f", "keys": [{"field": "a"}]})
    assert messages(data) == [
        "model.operators[0].keys: not used by an operator of type map (rule: field-applies)"
    ]


def join(spec: dict, *, watermarks: bool = True, inputs: tuple[str, ...] = ("src", "other"), **op) -> dict:
    """Two generator sources (with event time unless `watermarks` is False) into a join."""
    data = linear(
        {"id": "j", "type": "join", "inputs": list(inputs), "key": {"field": "k"}, "join": spec, **op}
    )
    data["model"]["sources"] += [
        {"id": name, "type": "generator", "config": {"count": 10}} for name in inputs if name != "src"
    ]
    for source in data["model"]["sources"]:
        if watermarks:
            source["watermark"] = {"timestampFn": "m:ts"}
    return data


def test_a_join_is_refused_with_the_field_and_the_rule():
    interval = {"kind": "interval", "lowerMs": -5, "upperMs": 5}
    assert messages(join(interval | {"how": "full", "lateOutput": "late"}, fn="m:combine")) == []
    assert (
        messages(join({"kind": "temporal", "how": "left"}, keys=[{"field": "k"}, {"field": "id"}], key=None))
        == []
    )
    window = {"kind": "window", "how": "anti", "window": {"kind": "session", "gapMs": 10}}
    assert messages(join(window)) == []
    assert messages(join({"kind": "interval", "lowerMs": 5, "upperMs": -5, "how": "right"})) == [
        "model.operators[0].join.lowerMs: lowerMs 5 is above upperMs -5: no pair could match"
        " (rule: join-bounds)"
    ]
    assert messages(join({"kind": "interval", "time": "processing", "window": {"kind": "tumbling"}})) == [
        "model.operators[0].join.lowerMs: an interval join needs lowerMs: right.ts - left.ts must lie in"
        " [lowerMs, upperMs] (rule: join-bounds)",
        "model.operators[0].join.time: a join matches records by their event timestamps: only 'event' time"
        " (a processing-time join would pair whatever arrived together, different in every run)"
        " (rule: join-time)",
        "model.operators[0].join.upperMs: an interval join needs upperMs: right.ts - left.ts must lie in"
        " [lowerMs, upperMs] (rule: join-bounds)",
        "model.operators[0].join.window: not used by a interval join (rule: field-applies)",
    ]
    assert messages(join({"kind": "temporal", "how": "full", "upperMs": 3}, inputs=("src", "a", "b"))) == [
        "model.operators[0].inputs: a join has two inputs, left then right: got 3 (rule: join-inputs)",
        "model.operators[0].join.how: a temporal join is one of inner, left, got 'full' (rule: join-how)",
        "model.operators[0].join.upperMs: not used by a temporal join (rule: field-applies)",
    ]
    bad_window = {
        "kind": "sliding",
        "sizeMs": 10,
        "allowedLatenessMs": 5,
        "lateOutput": "x",
        "time": "processing",
    }
    assert messages(join({"kind": "window", "window": bad_window}, watermarks=False)) == [
        "model.operators[0].join.kind: event time needs a watermark strategy on source 'other'"
        " (rule: event-time-watermarks)",
        "model.operators[0].join.kind: event time needs a watermark strategy on source 'src'"
        " (rule: event-time-watermarks)",
        "model.operators[0].join.window.allowedLatenessMs: not used by a window join: a window joins once,"
        " when the watermark passes its end (rule: field-applies)",
        "model.operators[0].join.window.lateOutput: a join's late records go to join.lateOutput"
        " (rule: field-applies)",
        "model.operators[0].join.window.slideMs: a sliding window needs slideMs of at least 1"
        " (rule: window-size)",
        "model.operators[0].join.window.time: a window join runs in event time only (rule: join-time)",
    ]
    with pytest.raises(ModelError) as refused:
        load_data(join({"kind": "interval", "lowerMs": "5s", "upperMs": 1.5}))
    assert str(refused.value) == (
        "model.operators[0].join.lowerMs: must be a valid integer (rule: schema)\n"
        "model.operators[0].join.upperMs: must be a valid integer (rule: schema)"
    )
    assert messages(join(interval, key=None)) == [
        "model.operators[0].key: keyed operator 'j' (join) needs a key: set 'key', or 'keys' (one per input),"
        " or read from a key_by (rule: key-required)"
    ]
    assert messages(join(None)) == [  # type: ignore[arg-type]
        "model.operators[0].join: a join operator needs 'join' (rule: join-required)"
    ]


def test_broadcast_inputs_are_listed_inputs_and_the_others_are_keyed_by_one_key():
    assert messages(two_inputs(key={"field": "a"}, broadcast=["other"])) == []
    assert messages(two_inputs(key={"field": "a"}, broadcast=["src", "other", "nope"])) == [
        "model.operators[0].broadcast: every input is broadcast: a process with broadcast inputs needs a"
        " keyed one too (rule: broadcast-inputs)",
        "model.operators[0].broadcast[2]: 'nope' is not one of the operator's inputs (src, other)"
        " (rule: broadcast-inputs)",
    ]
    assert messages(two_inputs(keys=[{"field": "a"}, {"field": "b"}], broadcast=["other"])) == [
        "model.operators[0].keys: a process with broadcast inputs keys its other inputs with one 'key'"
        " (rule: broadcast-key)"
    ]
    data = linear({"id": "m", "type": "map", "fn": "m:f", "broadcast": ["src"]})
    assert messages(data) == [
        "model.operators[0].broadcast: not used by an operator of type map (rule: field-applies)"
    ]


def test_a_state_ttl_applies_to_a_process_and_a_temporal_join_only():
    assert messages(two_inputs(key={"field": "a"}, stateTtlMs=1000, stateTtlTime="processing")) == []
    assert messages(join({"kind": "temporal"}, stateTtlMs=60_000)) == []
    assert messages(join({"kind": "temporal"}, stateTtlMs=0, stateTtlTime="processing")) == [
        "model.operators[0].stateTtlMs: must be at least 1, got 0 (rule: positive)",
        "model.operators[0].stateTtlTime: a temporal join's versions expire in event time only (a version"
        " valid for stateTtlMs after its timestamp) (rule: join-time)",
    ]
    assert messages(join({"kind": "interval", "lowerMs": 0, "upperMs": 5}, stateTtlMs=10)) == [
        "model.operators[0].stateTtlMs: state TTL applies to a process and a temporal join (a window's, a"
        " CEP pattern's and an interval or window join's state is dropped as event time passes it)"
        " (rule: field-applies)"
    ]
    assert messages(two_inputs(key={"field": "a"}, stateTtlTime="event")) == [
        "model.operators[0].stateTtlMs: event time needs a watermark strategy on source 'other'"
        " (rule: event-time-watermarks)",
        "model.operators[0].stateTtlMs: event time needs a watermark strategy on source 'src'"
        " (rule: event-time-watermarks)",
        "model.operators[0].stateTtlMs: stateTtlTime needs stateTtlMs (rule: ttl-required)",
    ]


def test_on_error_and_dead_letter_outputs_are_refused_where_they_do_not_apply():
    def with_letters(*operators: dict, source: dict | None = None, reads: str = "m:dead-letter") -> dict:
        data = linear(*operators)
        data["model"]["sources"][0] |= source or {}
        data["model"]["sinks"].append(
            {"id": "bad", "type": "file", "inputs": [reads], "config": {"path": "bad"}}
        )
        return data

    fine = {"id": "m", "type": "map", "fn": "m:f", "onError": "dead-letter"}
    assert messages(with_letters(fine)) == []
    assert messages(with_letters(fine | {"deadLetterOutput": "odd"}, reads="m:odd")) == []
    assert messages(with_letters(fine, source={"onError": "dead-letter"}, reads="src:dead-letter")) == []
    assert messages(
        with_letters(
            {"id": "m", "type": "map", "fn": "m:f", "onError": "fail", "deadLetterOutput": "odd"},
            {"id": "u", "type": "union", "inputs": ["m", "src"], "onError": "dead-letter"},
            {
                "id": "w",
                "type": "window",
                "key": {"field": "k"},
                "aggregate": {"kind": "count"},
                "window": {"kind": "tumbling", "time": "processing", "sizeMs": 5, "lateOutput": "late"},
                "onError": "dead-letter",
                "deadLetterOutput": "late",
            },
            source={"onError": "dead-letter", "deadLetterOutput": "Bad!"},
            reads="src:dead-letter",
        )
    ) == [
        "model.operators[0].deadLetterOutput: needs onError: dead-letter (rule: field-applies)",
        "model.operators[1].onError: an operator of type union runs no function (rule: field-applies)",
        "model.operators[2].deadLetterOutput: 'late' names another output (rule: distinct-outputs)",
        "model.sinks[1].inputs[0]: node 'src' has no output 'dead-letter' (outputs: Bad!, main)"
        " (rule: inputs-exist)",
        "model.sources[0].deadLetterOutput: 'Bad!' is not a valid id: lower-case letters, digits and '-',"
        " 1 to 40 characters, starting and ending with a letter or digit (rule: id-format)",
    ]
    with pytest.raises(
        ModelError, match=r"operators\[0\]\.onError: must be 'fail' or 'dead-letter' \(rule: schema\)"
    ):
        messages(with_letters({"id": "m", "type": "map", "fn": "m:f", "onError": "sometimes"}))


def test_an_async_operator_is_refused_with_the_field_and_the_rule():
    def async_map(**op) -> dict:
        return linear({"id": "a", "type": "async_map", "fn": "m:f", **op})

    assert messages(async_map(**{"async": {"capacity": 100, "retries": 3, "retryOn": "m:p"}})) == []
    assert messages(async_map()) == []  # the defaults: capacity 10, 10 s, no retry
    spec = {"capacity": 0, "timeoutMs": 0, "retries": -1, "backoffMs": -5, "onTimeout": "nocolon"}
    assert messages(async_map(**{"async": spec})) == [
        "model.operators[0].async.backoffMs: must be at least 0, got -5 (rule: non-negative)",
        "model.operators[0].async.capacity: must be at least 1, got 0 (rule: positive)",
        "model.operators[0].async.onTimeout: 'nocolon' is not a function reference of the form"
        " 'module:attribute' (rule: fn-format)",
        "model.operators[0].async.retries: must be at least 0, got -1 (rule: non-negative)",
        "model.operators[0].async.timeoutMs: must be at least 1, got 0 (rule: positive)",
    ]
    assert messages(async_map(**{"async": {"capacity": 20_000}})) == [
        "model.operators[0].async.capacity: must be at most 10000, got 20000 (rule: bounds)"
    ]
    assert messages(linear({"id": "m", "type": "map", "fn": "m:f", "async": {}})) == [
        "model.operators[0].async: not used by an operator of type map (rule: field-applies)"
    ]
    assert messages(linear({"id": "a", "type": "async_flat_map"})) == [
        "model.operators[0].fn: an operator of type async_flat_map needs 'fn' (rule: fn-required)"
    ]


def test_a_lookup_needs_what_its_kind_needs_and_nothing_else():
    def lookup(**spec) -> dict:
        return linear({"id": "l", "type": "lookup", "lookup": {"into": "r", **spec}})

    assert messages(lookup(kind="http", url="http://svc/{id}", cache={"maxEntries": 10})) == []
    assert messages(lookup(kind="postgres", query="SELECT 1 WHERE %(id)s", database="d", user="u")) == []
    assert messages(lookup(kind="postgres", url="http://x", database="d", cache={"ttlMs": 0})) == [
        "model.operators[0].lookup.cache.ttlMs: must be at least 1, got 0 (rule: positive)",
        "model.operators[0].lookup.query: a postgres lookup needs query (rule: lookup-required)",
        "model.operators[0].lookup.url: not used by a postgres lookup (rule: field-applies)",
        "model.operators[0].lookup.user: a postgres lookup needs user (rule: lookup-required)",
    ]
    assert messages(linear({"id": "l", "type": "lookup"})) == [
        "model.operators[0].lookup: a lookup needs 'lookup' (rule: lookup-required)"
    ]
    assert messages(
        linear({"id": "m", "type": "map", "fn": "m:f", "lookup": {"kind": "http", "into": "r"}})
    ) == ["model.operators[0].lookup: not used by an operator of type map (rule: field-applies)"]
