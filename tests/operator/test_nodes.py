"""`nodes.silent`: which pods' addresses do not answer, knocked at on real loopback sockets."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass

from nopstream_operator.nodes import silent


@dataclass(frozen=True)
class Pod:
    name: str
    ip: str


def test_a_pod_whose_address_does_not_answer_is_silent_one_that_accepts_or_refuses_is_not():
    with contextlib.ExitStack() as stack:
        listening = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        port = listening.getsockname()[1]
        # a listener that never accepts, its queue full: the kernel drops every new SYN, as a host
        # that is gone never answers one
        stack.enter_context(socket.create_server(("127.0.0.2", port), backlog=0))
        for _ in range(2):
            with contextlib.suppress(OSError):
                stack.enter_context(socket.create_connection(("127.0.0.2", port), timeout=0.3))
        pods = [
            Pod("accepts", "127.0.0.1"),
            Pod("refuses", "127.0.0.3"),  # nothing listens there: the host refuses at once
            Pod("gone", "127.0.0.2"),
            Pod("unscheduled", ""),
        ]
        began = time.monotonic()
        assert silent(pods, port, timeout_s=1.0) == {"gone"}
        took = time.monotonic() - began
        assert 1.0 <= took < 2.0, took  # knocked at together: one timeout, not one per pod
    assert silent([], port) == frozenset()
