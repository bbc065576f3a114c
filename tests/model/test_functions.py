"""User functions given to the builder as Python objects: recorded by their importable names (the
same model, plan and fingerprint as YAML's strings), or refused in one line saying what to do."""

from __future__ import annotations

import functools

import pytest
from pydantic import ValidationError

from nopstream.model.builder import JobBuilder, WrongArity
from nopstream.model.functions import NotImportable, reference
from nopstream.model.spec import KeySpec
from tests.conftest import EXAMPLES
from tests.model.test_builder import same_as_example


def test_functions_given_as_objects_build_the_same_model_as_their_names(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import wordcount

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
    counts = words.flat_map(wordcount.split, id="split").key_by(fn=wordcount.word, id="by-word")
    counts.aggregate("count", id="count", emit="final").sink(
        "out", "file", config={"path": "out/wordcount"}, parallelism=1
    )
    same_as_example(job.build(), "wordcount")
    assert KeySpec(fn=wordcount.word).fn == "wordcount:word"  # the model's own types take them too


def local_function() -> None:
    def inner(record):
        return record

    return inner


def test_a_function_task_processes_could_not_import_by_name_is_refused_saying_what_to_do():
    job = JobBuilder("j").source("s", "generator")
    with pytest.raises(NotImportable) as lam:
        job.map(lambda r: r)
    assert str(lam.value) == (
        f"a map operator: a lambda ({__name__}) has no name to import it by: define it with def at the top"
        " level of a module"
    )
    with pytest.raises(NotImportable) as inner:
        job.map(local_function(), id="m")
    assert str(inner.value) == (
        f"operator 'm' (map): 'local_function.<locals>.inner' ({__name__}) is defined inside a function:"
        " task processes import functions by name, so define it at the top level of a module"
    )

    wrapped = functools.partial(print)
    with pytest.raises(NotImportable, match="has no module and name to import it by"):
        job.map(wrapped)
    renamed = functools.wraps(reference)(lambda r: r)  # claims reference's name, is not it
    with pytest.raises(
        NotImportable, match=r"^a map operator: 'nopstream\.model\.functions:reference' does not import back"
    ):
        job.map(renamed)
    with pytest.raises(ValidationError, match=r"a lambda .* has no name to import it by"):
        KeySpec(fn=lambda r: r)
    assert reference("module:attr") == "module:attr"  # names as they are: validation judges them


def two(a, b):
    return a


def one(record):
    return record


def test_a_function_of_the_wrong_arity_is_refused_naming_the_operator():
    job = JobBuilder("j").source("s", "generator")
    with pytest.raises(WrongArity) as wrong:
        job.map(two, id="double")
    assert str(wrong.value) == (
        "operator 'double' (map): two(a, b) cannot be called as a map function, which is called with"
        " (record): give it exactly those parameters"
    )
    with pytest.raises(WrongArity) as wrong:
        job.key_by(fn=one, id="k").reduce(one, id="sum")
    assert str(wrong.value) == (
        "operator 'sum' (reduce): one(record) cannot be called as a reduce function, which is called with"
        " (accumulator, record): give it exactly those parameters"
    )
    with pytest.raises(WrongArity, match=r"^a key operator: two\(a, b\) cannot be called as a key function"):
        job.key_by(fn=two)
    job.key_by(fn=one, id="k2").reduce(two, id="sum")  # the right arities pass
