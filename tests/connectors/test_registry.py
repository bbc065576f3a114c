"""The connector modules with heavy clients are imported when a job uses them, and `preload`
(the local runner, before it forks the tasks) imports exactly the ones a plan uses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT

PROBE = """
import sys
from nopstream.connectors import registry
from nopstream.model.load import load_data
from nopstream.plan import compiler

heavy = ("minio", "confluent_kafka", "psycopg")
model = {{
    "jobId": "preload",
    "model": {{
        "sources": [{{"id": "in", "type": "s3", "config": {{"bucket": "bkt", "prefix": "in/"}}}}],
        "sinks": [{{"id": "out", "type": "{sink}", "config": {sink_config}}}],
    }},
}}
plan = compiler.compile_model(load_data(model), backend="local").partitioned
before = [m for m in heavy if m in sys.modules]
registry.preload(plan.operators().values())
print(before, [m for m in heavy if m in sys.modules])
"""


def imported(sink: str, sink_config: str) -> str:
    code = textwrap.dedent(PROBE).format(sink=sink, sink_config=sink_config)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def test_preload_imports_the_clients_of_the_connectors_a_plan_uses_and_no_other():
    assert imported("file", '{"path": "out"}') == "[] ['minio']"
    postgres = '{"database": "db", "user": "u", "table": "t", "columns": ["k"]}'
    assert imported("postgres", postgres) == "[] ['minio', 'psycopg']"
