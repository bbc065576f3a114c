"""One pass over a StreamJob at a time, across operator replicas, and one StreamJob per checkpoint
namespace across Kubernetes namespaces: the keys in a real etcd."""

from __future__ import annotations

import threading

from nopstream_operator.claims import CLAIMS, Holder, release
from nopstream_operator.handlers import exclusive_pass
from nopstream_operator.kube import EtcdView

from nopstream.cluster.layout import Layout, operator_pass


def test_a_pass_held_by_one_replica_is_skipped_by_another_and_free_after(etcd_server, monkeypatch):
    endpoint = "{}:{}".format(*etcd_server.endpoint)
    first, second = EtcdView(endpoint), EtcdView(endpoint)
    passes: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def slow_pass(ctx, namespace, name):  # the first replica's pass, still running
        passes.append(f"{ctx}:{namespace}/{name}")
        inside.set()
        release.wait(10)
        return name == "job"  # a settled job's pass (the daemon waits longer after it)

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
        assert exclusive_pass("b", second, "ns", "other", "op-b") is False  # ran, not settled
        # once the first pass is over, the key is free again (its lease revoked)
        assert exclusive_pass("b", second, "ns", "job", "op-b") is True
        assert passes == ["a:ns/job", "b:ns/other", "b:ns/job"]
        assert second.loop.run_until_complete(second.backend.get(operator_pass("ns", "job"))) is None
    finally:
        first.close()
        second.close()


def test_a_claim_is_held_by_the_first_replaced_only_from_its_value_and_released_by_its_uid(etcd_server):
    endpoint = "{}:{}".format(*etcd_server.endpoint)
    one, two = EtcdView(endpoint), EtcdView(endpoint)
    a, b = Holder("prod", "wc", "u-1").to_json(), Holder("staging", "wc", "u-2").to_json()
    try:
        assert one.hold(CLAIMS + "x", a) == a
        assert two.hold(CLAIMS + "x", b) == a  # held: the holder, not b
        assert two.replace(CLAIMS + "x", b, b) is False and two.hold(CLAIMS + "x", b) == a
        assert one.hold(CLAIMS + "y", a) == a
        assert release(two, "u-2") == 0
        assert release(one, "u-1") == 2
        assert two.hold(CLAIMS + "x", b) == b  # free once released
        assert two.replace(CLAIMS + "x", b, a) is True and one.hold(CLAIMS + "x", b) == a
    finally:
        release(one, "u-1")
        one.close()
        two.close()


def test_a_view_closed_while_a_pass_holds_it_closes_once_the_pass_ends(etcd_server, monkeypatch):
    """A daemon cancelled mid-pass closes its view from another thread: the close waits for the pass
    (the CI run that found it: "This event loop is already running", the daemon retried in 60 s)."""
    view = EtcdView("{}:{}".format(*etcd_server.endpoint))
    inside, release, runs = threading.Event(), threading.Event(), []

    def slow_pass(ctx, namespace, name):
        inside.set()
        release.wait(10)
        runs.append(view.run(Layout("ns", "job", "main")))  # the view still serves the pass

    monkeypatch.setattr("nopstream_operator.handlers.reconcile_once", slow_pass)
    worker = threading.Thread(target=exclusive_pass, args=("ctx", view, "ns", "job", "op-a"))
    worker.start()
    assert inside.wait(10)
    closer = threading.Thread(target=view.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive()  # waits for the pass
    release.set()
    worker.join(10)
    closer.join(10)
    assert runs == [0] and view.loop.is_closed()
