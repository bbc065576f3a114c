"""Bad input, as a careless or hostile user gives it: one clear line, the right exit code, no damage.

Each case is a row of the bad-input issue: the exact message and exit code of
`nopstream validate` (exit 1) or of `nopstream run` refusing to start (exit 3), and
that nothing was written where it should not be.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import after_dashboard_line, run_nopstream


def job(**spec) -> dict:
    """A small valid bare model (file in, file out), with some fields replaced."""
    model = {
        "jobId": "bad",
        "checkpoint": {"storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [{"id": "lines", "type": "file", "config": {"path": "in/*.txt"}}],
            "operators": [{"id": "up", "type": "map", "fn": "badfns:upper"}],
            "sinks": [{"id": "out", "type": "file", "config": {"path": "out"}}],
        },
    }
    model.update(spec)
    return model


def write(tmp_path: Path, model: dict | str) -> Path:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "a.txt").write_text("one line\nanother line\n")
    (tmp_path / "badfns.py").write_text(
        "def upper(line):\n    return line.upper()\n\n\ndef both(a, b):\n    return a + b\n"
    )
    path = tmp_path / "job.yaml"
    path.write_text(model if isinstance(model, str) else yaml.safe_dump(model, sort_keys=False))
    return path


def validate(tmp_path: Path, model: dict | str):
    write(tmp_path, model)
    return run_nopstream("validate", "job.yaml", cwd=tmp_path)


def one_issue(result, line: str) -> None:
    assert (result.code, result.out) == (1, ""), result
    assert result.err == f"invalid: 1 issue(s)\n  {line}\n"


def test_deep_nesting_is_refused_without_a_traceback(tmp_path):
    result = validate(tmp_path, "jobId: x\nmodel: " + "[" * 50_000 + "]" * 50_000 + "\n")
    one_issue(result, "job.yaml: line 2 column 71: nested deeper than 64 levels (rule: nesting-depth)")


def test_a_key_given_twice_is_refused(tmp_path):
    text = yaml.safe_dump(job(), sort_keys=False) + "jobId: other\n"
    one_issue(
        validate(tmp_path, text),
        "job.yaml: line 21 column 1: key 'jobId' is given twice (rule: duplicate-key)",
    )


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        ({"parallelism": True}, "parallelism: must be a valid integer (rule: schema)"),
        (
            {"stateShardCount": 1_000_000_000},
            "stateShardCount: must be at most 4096, got 1000000000 (rule: bounds)",
        ),
        (
            {"image": "my image'; rm -rf /"},
            'image: "my image\'; rm -rf /" is not an image reference (rule: image-format)',
        ),
        (
            {"resources": {"requests": {"cpu": "lots"}}},
            "resources.requests.cpu: 'lots' is not a quantity (e.g. 500m, 2, 512Mi) (rule: resources)",
        ),
    ],
    ids=["bool-parallelism", "huge-shard-count", "image", "cpu"],
)
def test_fields_out_of_their_rules(tmp_path, spec, line):
    one_issue(validate(tmp_path, job(**spec)), line)


def test_a_huge_parallelism_is_refused_at_once(tmp_path):
    model = job()
    model["model"]["sources"][0]["parallelism"] = 1_000_000_000
    started = time.monotonic()
    one_issue(
        validate(tmp_path, model),
        "model.sources[0].parallelism: must be at most 256, got 1000000000 (rule: bounds)",
    )
    assert time.monotonic() - started < 10  # a process start; the check itself builds nothing


def test_too_many_channels_are_refused_before_any_is_built(tmp_path):
    model = job(parallelism=256, stateShardCount=256)
    model["model"]["operators"] = [
        {"id": "by", "type": "key_by", "key": {"field": "w"}},
        {"id": "count", "type": "aggregate", "aggregate": "count"},
        {"id": "again", "type": "key_by", "key": {"field": "w"}},
        {"id": "count2", "type": "aggregate", "aggregate": "count"},
    ]
    one_issue(
        validate(tmp_path, model),
        "model: needs 131072 channels (upstream x downstream parallelism on each edge that is not forward),"
        " at most 100000: lower the parallelism (rule: bounds)",
    )


@pytest.mark.parametrize("namespace", ["../../../tmp/x", "/tmp/c/abs"])
def test_a_checkpoint_namespace_is_a_relative_path(tmp_path, namespace):
    one_issue(
        validate(tmp_path, job(checkpointNamespace=namespace)),
        f"checkpointNamespace: '{namespace}' is not a relative path of lower-case letters, digits, '.', '_'"
        " and '-' segments joined by '/' (each starting and ending with a letter or digit, at most 200"
        " characters) (rule: namespace-format)",
    )


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/etc", "'/etc' is a system directory"),
        ("/proc/self", "'/proc/self' is a system directory"),
        ("/", "'/' is a system directory"),
        ("../../x", "'../../x' must not go up with '..'"),
        ("", "must not be empty (it would be the working directory)"),
    ],
    ids=["etc", "proc", "root", "up", "empty"],
)
def test_a_job_writes_nowhere_it_should_not(tmp_path, path, problem):
    model = job()
    model["model"]["sinks"][0]["config"]["path"] = path
    one_issue(validate(tmp_path, model), f"model.sinks[0].config.path: {problem} (rule: write-path)")
    model = job(checkpoint={"storage": {"local": {"path": path}}})
    one_issue(validate(tmp_path, model), f"checkpoint.storage.local.path: {problem} (rule: write-path)")


S3 = {"storage": {"s3": {"endpoint": "http://s3:9000", "bucket": "checkpoints"}}}


def test_plan_for_a_namespace_that_is_not_one_is_refused(tmp_path):
    write(tmp_path, job(checkpoint=S3))
    result = run_nopstream(
        "plan", "job.yaml", "--backend", "kubernetes", "--namespace", "../../x", cwd=tmp_path
    )
    one_issue(
        result, "namespace: '../../x' is not a Kubernetes namespace name (a DNS label) (rule: namespace-name)"
    )
    result = run_nopstream("plan", "job.yaml", "--namespace", "prod", cwd=tmp_path)
    assert result.code == 2 and result.out == ""
    assert result.err.endswith(
        "error: --namespace is a Kubernetes namespace: it needs --backend kubernetes\n"
    )


def test_local_checkpoint_storage_is_refused_on_kubernetes_and_accepted_locally(tmp_path):
    write(tmp_path, job())
    for command in ("validate", "plan"):
        result = run_nopstream(command, "job.yaml", "--backend", "kubernetes", cwd=tmp_path)
        one_issue(
            result,
            "checkpoint.storage.local: each pod has a file system of its own, so tasks would not share"
            " checkpoints: use s3 (rule: shared-storage)",
        )
        assert run_nopstream(command, "job.yaml", cwd=tmp_path).code == 0


def test_jobs_whose_joined_names_would_collide_get_distinct_pod_names(tmp_path):
    def tasks(job_id: str, source: str) -> list[str]:
        model = job(jobId=job_id, checkpoint=S3)
        model["model"]["sources"][0]["id"] = source
        model["model"]["operators"][0]["inputs"] = [source]
        write(tmp_path, model)
        result = run_nopstream(
            "plan",
            "job.yaml",
            "--layer",
            "deployment",
            "--backend",
            "kubernetes",
            "--format",
            "json",
            cwd=tmp_path,
        )
        assert result.code == 0, result
        return [t["name"] for t in json.loads(result.out)["plan"]["tasks"]]

    first, second = tasks("a-b", "c"), tasks("a", "b-c")
    assert first[0].startswith("a-b-c-0--") and second[0].startswith("a-b-c-0--")
    assert not set(first) & set(second)
    assert tasks("ab", "c") == ["ab-c-0"]  # ids of letters and digits read as given


def test_a_node_named_coordinator_is_refused(tmp_path):
    model = job()
    model["model"]["sinks"][0]["id"] = "coordinator"
    one_issue(
        validate(tmp_path, model),
        "model.sinks[0].id: 'coordinator' names the job's coordinator pods (rule: reserved-id)",
    )


def test_the_default_checkpoint_namespace_on_kubernetes_holds_the_kubernetes_namespace(tmp_path):
    write(tmp_path, job(checkpoint=S3))
    namespaces = {}
    for ns in ("prod", "staging"):
        result = run_nopstream(
            "plan", "job.yaml", "--backend", "kubernetes", "--namespace", ns, "--format", "json", cwd=tmp_path
        )
        namespaces[ns] = json.loads(result.out)["plan"]["identity"]["checkpointNamespace"]
    local = json.loads(run_nopstream("plan", "job.yaml", "--format", "json", cwd=tmp_path).out)
    assert namespaces == {"prod": "prod/bad/main", "staging": "staging/bad/main"}
    assert local["plan"]["identity"]["checkpointNamespace"] == "bad/main"


def test_a_function_that_is_here_but_wrong_is_found_by_validate(tmp_path):
    model = job()
    model["model"]["operators"][0]["fn"] = "badfns:nope"
    one_issue(
        validate(tmp_path, model),
        "model.operators[0].fn: cannot import user function 'badfns:nope': module 'badfns' has no attribute"
        " 'nope' (rule: fn-importable)",
    )


def test_a_function_that_cannot_take_its_arguments_is_found_before_the_run(tmp_path):
    model = job()
    model["model"]["operators"][0]["fn"] = "badfns:both"
    line = (
        "model.operators[0].fn: 'badfns:both': both(a, b) cannot be called as a map function, which is"
        " called with (record) (rule: fn-arity)"
    )
    one_issue(validate(tmp_path, model), line)
    cannot_start(tmp_path, model, line)


def cannot_start(tmp_path: Path, model: dict, *lines: str, args: tuple[str, ...] = ()) -> None:
    write(tmp_path, model)
    result = run_nopstream("run", "job.yaml", *args, cwd=tmp_path)
    assert (result.code, result.out) == (3, ""), result
    assert result.err == "job 'bad' cannot start:\n" + "".join(f"  {line}\n" for line in lines)
    assert not (tmp_path / "out").exists() and not (tmp_path / ".nopstream").exists()


@pytest.mark.parametrize("mode", [(), ("--in-process",)], ids=["processes", "in-process"])
def test_a_function_that_is_nowhere_stops_the_run_before_it_starts(tmp_path, mode):
    model = job()
    model["model"]["operators"][0]["fn"] = "nosuchmod:f"
    assert validate(tmp_path, model).code == 0  # it may live in the job's image
    cannot_start(
        tmp_path,
        model,
        "model.operators[0].fn: cannot import user function 'nosuchmod:f': No module named 'nosuchmod'"
        " (rule: fn-importable)",
        args=mode,
    )


def test_a_sink_or_checkpoint_path_that_is_a_file_stops_the_run_before_it_starts(tmp_path):
    (tmp_path / "taken").write_text("a file")
    model = job(checkpoint={"storage": {"local": {"path": "taken/cp"}}})
    model["model"]["sinks"][0]["config"]["path"] = "taken"
    cannot_start(
        tmp_path,
        model,
        "checkpoint.storage.local.path: 'taken/cp' cannot be created: 'taken' is a file (rule: writable)",
        "model.sinks[0].config.path: 'taken' is a file, not a directory (rule: writable)",
    )
    assert (tmp_path / "taken").read_text() == "a file"


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        (
            "in/*.csv",
            "'in/*.csv' matches no file (a source that should wait for files sets discoveryIntervalMs)",
        ),
        ("in", "'in' is a directory: name its files (e.g. 'in/*.txt')"),
    ],
    ids=["no-match", "directory"],
)
def test_a_file_source_with_nothing_to_read_stops_the_run_before_it_starts(tmp_path, path, problem):
    model = job()
    model["model"]["sources"][0]["config"]["path"] = path
    cannot_start(tmp_path, model, f"model.sources[0].config.path: {problem} (rule: readable)")


def test_a_manifest_path_that_is_a_directory_fails_the_run_in_one_line(tmp_path):
    write(tmp_path, job())
    (tmp_path / "cp" / "checkpoint" / "bad" / "main" / "1" / "_manifest.json").mkdir(parents=True)
    result = run_nopstream("run", "job.yaml", cwd=tmp_path)
    assert result.code == 3, result
    assert after_dashboard_line(result.err) == (
        "job 'bad' failed: the coordinator cannot write checkpoints: cannot write"
        f" {tmp_path}/cp/checkpoint/bad/main/1/_manifest.json: Is a directory\n"
    )


def test_status_of_a_refused_manifest_exits_one(tmp_path):
    write(tmp_path, job())
    assert run_nopstream("run", "job.yaml", "--quiet", cwd=tmp_path).code == 0
    manifest = sorted((tmp_path / "cp").glob("checkpoint/bad/main/*/_manifest.json"))[-1]
    body = json.loads(manifest.read_text())
    body["epoch"] = 999
    manifest.write_text(json.dumps(body))
    result = run_nopstream("status", "cp", cwd=tmp_path)
    assert result.code == 1, result
    assert (
        f"  latest manifest refused: manifest {manifest.relative_to(tmp_path / 'cp')} of epoch" in result.out
    )


def test_savepoint_asks_the_run_that_is_live_not_a_stale_one(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    # A killed earlier command left run-5's control URL behind; the live command is at run 1.
    stale = tmp_path / ".nopstream" / "runs" / "bad" / "run-5"
    stale.mkdir(parents=True)
    (stale / "control-url").write_text("http://127.0.0.1:9")
    os.utime(stale / "control-url", (time.time() - 3600, time.time() - 3600))
    model = job()
    model["model"]["sources"][0] = {
        "id": "lines",
        "type": "generator",
        # 10 s: a loaded machine takes seconds to start `nopstream savepoint`, and the job must outlast it
        "config": {"kind": "words", "count": 10000, "ratePerSecond": 1000},
    }
    write(tmp_path, model)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    live = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml", "--quiet"], cwd=tmp_path, env=env
    )
    try:
        url = tmp_path / ".nopstream" / "runs" / "bad" / "run-1" / "control-url"
        deadline = time.monotonic() + 30
        while not url.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        result = run_nopstream("savepoint", "job.yaml", cwd=tmp_path)
        assert result.code == 0, result
        assert result.out.startswith("savepoint requested: the next epoch of job 'bad' is a savepoint")
        assert live.wait(60) == 0
    finally:
        live.kill()
    assert not url.exists()  # a finished run leaves no control URL to be found
