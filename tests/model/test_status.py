"""The StreamJob status codec (`model/status.py`): what the operator reads and the patches it writes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nopstream.model.status import Savepoint, Stopping, StreamJobStatus


def test_a_status_of_an_older_operator_is_read_without_the_keys_this_one_dropped():
    held = {
        "phase": "Running",
        "run": 3,
        "lastStableSpec": {"model": {}},  # written by older versions, never read
        "stopping": {"for": "suspend", "after": 7, "requestedInRun": 3},
        "savepoints": [{"epoch": 4, "nonce": "a"}, {"epoch": 6}],
    }
    status = StreamJobStatus.read(held)
    assert (status.phase, status.run) == ("Running", 3)
    assert status.stopping == Stopping(purpose="suspend", after=7, requested_in_run=3)
    assert status.savepoints == [Savepoint(epoch=4, nonce="a"), Savepoint(epoch=6)]
    assert StreamJobStatus.read(None) == StreamJobStatus()


def test_a_patch_names_fields_as_the_status_holds_them_and_null_removes_one():
    patch = StreamJobStatus.patch(
        tasks_ready=2,
        stopping=None,
        savepoints=[Savepoint(epoch=4)],
        savepoint_request=None,
    )
    expected = {"tasksReady": 2, "stopping": None, "savepoints": [{"epoch": 4}], "savepointRequest": None}
    assert patch == expected
    assert StreamJobStatus.patch(stopping=Stopping(purpose="upgrade to x", after=2)) == {
        "stopping": {"for": "upgrade to x", "after": 2}
    }
    with pytest.raises(ValidationError):
        StreamJobStatus.patch(tasks_redy=2)  # a misspelt field is refused, never written
