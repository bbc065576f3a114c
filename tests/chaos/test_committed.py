"""What `nopstream chaos` reads of a run's output: a sink it cannot read is said in one line."""

from __future__ import annotations

import pytest

from e2e import servers
from nopstream.local.chaos import ChaosFailed, committed


def test_a_sink_whose_server_is_gone_is_named_in_one_line(monkeypatch):
    """A PostgreSQL sink whose server does not answer (nothing listens on its port): ChaosFailed naming
    the sink and the client's words, not a traceback (a CI run's chaos printed an internal error)."""
    monkeypatch.setenv("NOPSTREAM_POSTGRES_PASSWORD", "unused")
    port = servers.free_port()
    sink = {
        "id": "per-row",
        "type": "postgres",
        "inputs": ["count"],
        "config": {
            "port": port,
            "database": "shop",
            "user": "nopstream",
            "table": "counts",
            "columns": ["k"],
        },
    }
    with pytest.raises(ChaosFailed) as failed:
        committed({"jobId": "j", "model": {"sinks": [sink]}})
    said = str(failed.value)
    assert said.startswith(
        "could not read what sink 'per-row' committed: connection failed: connection to server at"
        f' "127.0.0.1", port {port} failed: Connection refused'
    ), said
    assert "\n" not in said
