"""One pass over a StreamJob at a time, across operator replicas: the pass key in a real etcd."""

from __future__ import annotations

import threading

from nopstream_operator.handlers import exclusive_pass
from nopstream_operator.kube import EtcdView

from nopstream.cluster.layout import operator_pass


def test_a_pass_held_by_one_replica_is_skipped_by_another_and_free_after(etcd_server, monkeypatch):
    endpoint = "{}:{}".format(*etcd_server.endpoint)
    first, second = EtcdView(endpoint), EtcdView(endpoint)
    passes: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def slow_pass(ctx, namespace, name):  # the first replica's pass, still running
        passes.append(f"{ctx}:{namespace}/{name}")
        inside.set()
        release.wait(10)

    monkeypatch.setattr("nopstream_operator.handlers.reconcile_once", slow_pass)
    try:
        ran: list[bool] = []
        worker = threading.Thread(target=lambda: ran.append(exclusive_pass("a", first, "ns", "job", "op-a")))
        worker.start()
        assert inside.wait(10)
        # the other replica's pass over the same job, meanwhile: skipped, nothing run
        assert exclusive_pass("b", second, "ns", "job", "op-b") is False
        # another job is not held
        release.set()
        worker.join(10)
        assert ran == [True]
        assert exclusive_pass("b", second, "ns", "other", "op-b") is True
        # once the first pass is over, the key is free again (its lease revoked)
        assert exclusive_pass("b", second, "ns", "job", "op-b") is True
        assert passes == ["a:ns/job", "b:ns/other", "b:ns/job"]
        assert second.loop.run_until_complete(second.backend.get(operator_pass("ns", "job"))) is None
    finally:
        first.close()
        second.close()
