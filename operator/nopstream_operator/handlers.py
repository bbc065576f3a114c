"""The kopf handlers: thin decorators around `reconcile` (run as `kopf run -m nopstream_operator`).

One daemon per StreamJob runs a pass every PASS_SECONDS (observe, validate,
reconcile) in a worker thread, every SETTLED_PASS_SECONDS once the job is settled (ended,
suspended or invalid, and its last pass wrote nothing), and at once when the pod watch
sees one of the job's pods lost, the node watch a node lost or the job's watch a new
generation of its spec (`wakeups`, `nodes`). Each pass holds the job's key in etcd
(`layout.operator_pass`), so the passes of one job never overlap, not even across
operator replicas: when kopf peering hands over, the paused replica's daemon may be in
a pass while the newly active one starts its own, and two passes with two views of one
job would each take a run. A pass that fails is logged and the next one tries again.
Deleting a StreamJob runs `cleanup` behind kopf's finalizer (pods and plan ConfigMaps go;
checkpoints stay in storage).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import socket
from typing import Any

import kopf

from nopstream.cluster.layout import operator_pass
from nopstream.plan.deployment import TASK_PORT
from nopstream_operator.kube import EtcdView, Kube, load_config
from nopstream_operator.nodes import LostNodes, silent
from nopstream_operator.observed import Context
from nopstream_operator.reconcile import cleanup, reconcile_once
from nopstream_operator.resources import GROUP, LABEL_JOB, PLURAL, VERSION, PodSettings
from nopstream_operator.wakeups import Wakeups, is_loss

PASS_SECONDS = 1.0
SETTLED_PASS_SECONDS = 30.0
"""The period of a settled job's passes: what changes it (its spec, its pods) wakes it at once; a
pass a second over every finished job cost the operator and the API server a tenth of a core each
with five such jobs."""
# How long a pass's key outlives an operator that died holding it.
PASS_LEASE_SECONDS = 30
FINALIZER = "nopstream.io/finalizer"
WAKEUPS = Wakeups()
LOST_NODES = LostNodes()


def pod_settings(env: dict[str, str] | None = None) -> PodSettings:
    """The pods' command, extra environment and etcd endpoint, from the operator's environment.

    NOPSTREAM_ETCD (host:port, required), NOPSTREAM_POD_COMMAND (JSON list, default
    ["nopstream"]), NOPSTREAM_POD_ENV (JSON object), NOPSTREAM_POD_LEASE_TTL (seconds),
    NOPSTREAM_NETWORK_POLICY ("false": no NetworkPolicy per job), NOPSTREAM_NETWORK_POLICY_FROM
    (a JSON list of more NetworkPolicy peers), NOPSTREAM_ALLOWED_SECRETS (a JSON list of the
    Secrets a StreamJob's secretRef may name; unset: any), NOPSTREAM_ETCD_ACCESS_SECRET (the
    Secret of TLS and credentials to etcd the pods mount; the operator's own is NOPSTREAM_ETCD_ACCESS,
    `cluster.etcd`), POD_NAMESPACE (the operator's own, admitted).
    """
    env = dict(os.environ) if env is None else env
    etcd = env.get("NOPSTREAM_ETCD", "").strip()
    if not etcd:
        raise kopf.PermanentError("NOPSTREAM_ETCD is not set (the etcd endpoint host:port is required)")
    return PodSettings(
        etcd=etcd,
        command=tuple(json.loads(env.get("NOPSTREAM_POD_COMMAND") or '["nopstream"]')),
        extra_env=dict(json.loads(env.get("NOPSTREAM_POD_ENV") or "{}")),
        lease_ttl=int(env.get("NOPSTREAM_POD_LEASE_TTL") or 10),
        network_policy=env.get("NOPSTREAM_NETWORK_POLICY", "true").strip().lower() != "false",
        operator_namespace=env.get("POD_NAMESPACE") or None,
        etcd_access_secret=env.get("NOPSTREAM_ETCD_ACCESS_SECRET", "").strip() or None,
        ingress_from=tuple(json.loads(env.get("NOPSTREAM_NETWORK_POLICY_FROM") or "[]")),
        allowed_secrets=(
            frozenset(json.loads(allowed)) if (allowed := env.get("NOPSTREAM_ALLOWED_SECRETS")) else None
        ),
    )


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Our finalizer name, events at INFO, and credentials from the cluster or KUBECONFIG."""
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.INFO
    load_config()


def _emit(job: dict[str, Any], kind: str, reason: str, message: str) -> None:
    # kopf takes any mapping with apiVersion, kind and metadata as the object here.
    kopf.event(job, type=kind, reason=reason, message=message)  # type: ignore[arg-type]


@kopf.on.event("v1", "pods", labels={LABEL_JOB: kopf.PRESENT})
async def pod_event(event: kopf.RawEvent, body: kopf.Body, namespace: str | None, **_: Any) -> None:
    """One of a job's pods lost: its daemon's next pass starts now (async: on the daemons' loop)."""
    if is_loss(event.get("type"), dict(event["object"])):
        WAKEUPS.wake(namespace or "default", body.metadata.labels[LABEL_JOB])


@kopf.on.event("v1", "nodes")
async def node_event(event: kopf.RawEvent, **_: Any) -> None:
    """A node's readiness: one newly lost starts every job's next pass now (its pods are replaced)."""
    if LOST_NODES.seen(event.get("type"), dict(event["object"])):
        WAKEUPS.wake_all()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(event: kopf.RawEvent, body: kopf.Body, namespace: str | None, **_: Any) -> None:
    """A new generation of a StreamJob's spec: its daemon's next pass starts now."""
    job_id = body.spec.get("jobId") or body.metadata.name
    WAKEUPS.generation(namespace or "default", job_id, body.metadata.get("generation"))


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def drive(
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    **_: Any,
) -> None:
    """Pass after pass over one StreamJob until it is deleted or the operator stops.

    The daemon waits on the event loop and takes a worker thread only for a pass: a
    sync daemon would hold a thread of kopf's pool for the job's whole life, and that
    pool (min(32, cores + 4) threads) would then leave every job past the sixth on a
    2-core node undriven.
    """
    settings = pod_settings()
    etcd = await asyncio.to_thread(EtcdView, settings.etcd)
    ctx = Context(
        await asyncio.to_thread(Kube),
        etcd,
        settings,
        _emit,
        lost_nodes=LOST_NODES.names,
        silent=functools.partial(silent, port=TASK_PORT),
    )
    namespace = namespace or "default"
    job_id = spec.get("jobId") or name  # what the job's pods are labelled with
    holder = f"{socket.gethostname()}/{os.getpid()}"
    WAKEUPS.watch(namespace, job_id)
    try:
        while not stopped:
            settled = False
            try:
                settled = await asyncio.to_thread(exclusive_pass, ctx, etcd, namespace, name, holder)
            except Exception:
                logger.exception("pass over %s/%s failed; the next pass tries again", namespace, name)
            await WAKEUPS.wait(namespace, job_id, SETTLED_PASS_SECONDS if settled else PASS_SECONDS)
    finally:
        WAKEUPS.forget(namespace, job_id)
        # cancelled (kopf pausing for a peer, the operator stopping) while a pass runs: the pass goes on
        # in its thread, and the view closes once it ends (`EtcdView.lock`)
        await asyncio.to_thread(etcd.close)


def exclusive_pass(ctx: Context, etcd: EtcdView, namespace: str, name: str, holder: str) -> bool:
    """One pass over the job unless another pass (of any replica) holds it; whether it ran and found
    the job settled (`reconcile_once`)."""
    with etcd.exclusive(operator_pass(namespace, name), holder, PASS_LEASE_SECONDS) as ours:
        return ours and reconcile_once(ctx, namespace, name)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def delete(name: str, namespace: str | None, spec: kopf.Spec, body: kopf.Body, **_: Any) -> None:
    """Remove the job's pods and plan ConfigMaps and let go of its checkpoint namespaces; keep its
    checkpoints."""
    etcd = EtcdView(pod_settings().etcd)
    try:
        cleanup(Kube(), etcd, namespace or "default", spec.get("jobId") or name, body.metadata.uid or "")
    finally:
        etcd.close()


def peering_priority(pod_name: str) -> int:
    """This replica's kopf peering priority, stable per pod and distinct between pods.

    kopf freezes every operator of a peering when two share a priority, and the
    replicas of a Deployment are alike: the pod name tells them apart.
    """
    digest = hashlib.blake2b(pod_name.encode(), digest_size=4).digest()
    return 1 + int.from_bytes(digest, "big") % 1_000_000


def run(*, liveness: str | None = None) -> None:
    """Run the operator in this process (`nopstream operator`), cluster-wide.

    With NOPSTREAM_OPERATOR_PEERING set, replicas peer through that ClusterKopfPeering:
    the one with the highest priority (from POD_NAME) acts, the others wait.
    """
    peering = os.environ.get("NOPSTREAM_OPERATOR_PEERING") or None
    kopf.configure(verbose=False)
    kopf.run(
        clusterwide=True,
        standalone=peering is None,
        peering_name=peering,
        priority=peering_priority(os.environ.get("POD_NAME") or socket.gethostname()) if peering else None,
        liveness_endpoint=liveness,
    )
