"""The operator's calls to the Kubernetes API (the `kubernetes` client), and its view of etcd.

Every write the operator makes goes through `Kube`, so a test can count them; an
object that already exists or is already gone is not an error (passes repeat).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from nopstream.checkpoint.restore import RestoreRequest
from nopstream.cluster.election import current_leader
from nopstream.cluster.epochlog import EpochEntry, EpochLog
from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.etcd_access import access_from_env
from nopstream.cluster.layout import Layout
from nopstream.cluster.registry import FailureReport, Registry
from nopstream.plan.epochs import EpochKind, EpochState
from nopstream_operator.resources import GROUP, LABEL_JOB, PLURAL, VERSION

log = logging.getLogger(__name__)
T = TypeVar("T")


def load_config() -> None:
    """In-cluster credentials, else the kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


@dataclass(frozen=True)
class EpochSummary:
    """What a pass shows of a job's epoch log (times in ms since the Unix epoch, the coordinator's clock)."""

    durable: int | None = None
    durable_at: int | None = None
    committed: int | None = None
    committed_at: int | None = None
    savepoints: tuple[int, ...] = ()
    pending_commits: tuple[int, ...] = ()
    """Durable epochs whose sink transactions are not all committed yet."""
    leader: tuple[str, int] | None = None
    """The leading coordinator: (its pod, its fencing token)."""


@dataclass(frozen=True)
class JobInEtcd:
    """What one pass read of a job in etcd (`EtcdView.observe`)."""

    run: int = 0
    entries: tuple[EpochEntry, ...] = ()
    durable: int | None = None
    durable_at: int | None = None
    leader: tuple[str, int] | None = None
    """The leading coordinator: (its pod, its fencing token)."""
    leader_endpoint: str | None = None
    serving: Mapping[str, str] | None = None
    """The run's serving map (task id -> pod), None when the run was entered without one."""
    failed: Mapping[str, FailureReport] = field(default_factory=dict)
    """The run's failure reports of kept pods, by task id."""

    @property
    def last_epoch(self) -> int:
        """The highest epoch in the log (0 when empty)."""
        return self.entries[-1].epoch if self.entries else 0

    def stopped_at(self, *, after: int) -> int | None:
        """The stop savepoint committed after epoch `after`, if there is one."""
        return next(
            (
                e.epoch
                for e in self.entries
                if e.epoch > after and e.state is EpochState.COMMITTED and e.kind == EpochKind.STOP
            ),
            None,
        )

    @property
    def summary(self) -> EpochSummary:
        """The epoch log as a pass shows it."""
        committed = [e for e in self.entries if e.state is EpochState.COMMITTED]
        return EpochSummary(
            durable=self.durable,
            durable_at=self.durable_at,
            committed=committed[-1].epoch if committed else None,
            committed_at=committed[-1].at if committed else None,
            savepoints=tuple(e.epoch for e in committed if e.kind.is_savepoint),
            pending_commits=tuple(e.epoch for e in self.entries if e.state is EpochState.DURABLE),
            leader=self.leader,
        )


class NameTaken(RuntimeError):
    """An object this StreamJob needs has a name another owner's object has already."""


class Kube:
    """Reads and writes of one namespace's objects."""

    def __init__(self) -> None:
        """Clients from the loaded configuration."""
        self.core = client.CoreV1Api()
        self.networking = client.NetworkingV1Api()
        self.custom = client.CustomObjectsApi()
        self.writes = 0

    def _calls(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The (create, read) calls of a kind the operator creates."""
        return {
            "Pod": (self.core.create_namespaced_pod, self.core.read_namespaced_pod),
            "ConfigMap": (self.core.create_namespaced_config_map, self.core.read_namespaced_config_map),
            "Secret": (self.core.create_namespaced_secret, self.core.read_namespaced_secret),
            "Service": (self.core.create_namespaced_service, self.core.read_namespaced_service),
            "NetworkPolicy": (
                self.networking.create_namespaced_network_policy,
                self.networking.read_namespaced_network_policy,
            ),
        }[kind]

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A StreamJob, or None when it is gone."""
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
            return found
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pods(self, namespace: str, job_id: str) -> list[dict[str, Any]]:
        """The job's pods, as the API's JSON gives them."""
        # not through the client's models: building them and turning them back into data was most of
        # the listing, half of a pass's time in a profile (a pass a second for every running job)
        found = self.core.list_namespaced_pod(
            namespace, label_selector=f"{LABEL_JOB}={job_id}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(found.data)["items"]
        return items

    def exists(self, kind: str, namespace: str, name: str) -> bool:
        """Whether an object of a kind the operator creates exists."""
        try:
            found = self._calls(kind)[1](name, namespace, _preload_content=False)
            found.read()  # its body, read (the connection goes back to the pool) and not made a model
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data, or None."""
        try:
            return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def owned_secret(self, namespace: str, name: str, owner_uid: str) -> dict[str, bytes] | None:
        """The data of a Secret the object `owner_uid` owns, by key, decoded; None when there is none.

        NameTaken when a Secret of that name belongs to another owner.
        """
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        if owner_uid not in {o.uid for o in secret.metadata.owner_references or []}:
            raise NameTaken(f"Secret {namespace}/{name} exists and is not this job's")
        return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}

    def create(self, manifest: dict[str, Any]) -> None:
        """Create an object of a kind `_calls` knows; an existing one is adopted only if this job owns it.

        NameTaken when the name belongs to another owner (another StreamJob, or none).
        """
        self.writes += 1
        meta = manifest["metadata"]
        ns, name = meta["namespace"], meta["name"]
        create, read = self._calls(manifest["kind"])
        try:
            create(ns, manifest)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = read(name, ns)
        if existing.metadata.deletion_timestamp is not None:
            return  # going away (a StreamJob deleted and applied again): a later pass creates it
        owners = {o.uid: f"{o.kind} {o.name}" for o in existing.metadata.owner_references or []}
        ours = {o["uid"] for o in meta.get("ownerReferences", [])}
        if not ours & set(owners):
            held = f" (owned by {', '.join(owners.values())})" if owners else ""
            raise NameTaken(f"{manifest['kind']} {ns}/{name} exists and is not this job's{held}")

    def delete_pod(self, namespace: str, name: str, *, grace: int = 5) -> None:
        """Delete a pod; one already gone is fine."""
        self.writes += 1
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def delete_configmaps(self, namespace: str, job_id: str) -> None:
        """Delete the job's plan ConfigMaps."""
        self.writes += 1
        self.core.delete_collection_namespaced_config_map(namespace, label_selector=f"{LABEL_JOB}={job_id}")

    def label_pod(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        """Set (or, with None, remove) labels of a pod; one already gone is fine."""
        self.writes += 1
        try:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": labels}})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete a Secret, Service or NetworkPolicy; one already gone is fine."""
        self.writes += 1
        call = {
            "Secret": self.core.delete_namespaced_secret,
            "Service": self.core.delete_namespaced_service,
            "NetworkPolicy": self.networking.delete_namespaced_network_policy,
        }[kind]
        try:
            call(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch a StreamJob's status."""
        self.writes += 1
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}
        )


class EtcdView:
    """The operator's reads and compare-and-swaps in etcd, from synchronous code (own event loop)."""

    def __init__(self, endpoint: str) -> None:
        """A client of the etcd server at host:port."""
        host, _, port = endpoint.rpartition(":")
        # one thread at a time drives the loop; a pass holds the view throughout (`exclusive`), so a
        # daemon cancelled while its pass runs in a worker thread closes the view only after the pass
        self.lock = threading.RLock()
        self.loop = asyncio.new_event_loop()
        self.backend = self.loop.run_until_complete(self._connect(host, int(port)))

    @staticmethod
    async def _connect(host: str, port: int) -> EtcdBackend:
        return EtcdBackend(host, port, access=access_from_env())  # the chart's etcd.accessSecret

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        with self.lock:
            return self.loop.run_until_complete(call)

    def close(self) -> None:
        """Close the client and the loop, once no pass holds the view."""
        with self.lock:
            self.loop.run_until_complete(self.backend.close())
            self.loop.close()

    @contextlib.contextmanager
    def exclusive(self, key: str, holder: str, ttl: int) -> Iterator[bool]:
        """Hold `key` for the block (bound to a lease of `ttl` s); False, holding nothing, while another does.

        A holder that dies inside the block frees the key when its lease expires.
        """
        with self.lock:
            lease = self._run(self.backend.grant(ttl))
            try:
                created = self._run(self.backend.create(key, holder.encode(), lease=lease))
                yield created is not None
            finally:
                self._run(self.backend.revoke(lease))  # deletes the key if it is ours

    def hold(self, key: str, value: bytes) -> bytes:
        """Hold `key` with `value` unless it is held (no lease: until `drop_held`); its value now."""

        async def take() -> bytes:
            while True:  # read first: a held key (every pass of a running job) costs one call
                entry = await self.backend.get(key)
                if entry is not None:
                    return entry.value
                if await self.backend.create(key, value) is not None:
                    return value

        return self._run(take())

    def replace(self, key: str, expected: bytes, value: bytes) -> bool:
        """Write `key` only if it holds `expected`; whether it did."""
        return self._run(self.backend.compare_and_swap(key, expected, value))

    def drop_held(self, prefix: str, held: Callable[[bytes], bool]) -> int:
        """Delete the keys under `prefix` whose value `held` takes; how many."""

        async def drop() -> int:
            found = await self.backend.get_prefix(prefix)
            return sum([await self.backend.delete(k) for k, e in sorted(found.items()) if held(e.value)])

        return self._run(drop())

    def run(self, layout: Layout) -> int:
        """The job's current run (0 before the first)."""
        return self._run(Registry(self.backend, layout).current_run())

    def advance_run(
        self,
        layout: Layout,
        expected: int,
        *,
        serving: Mapping[str, str] | None = None,
        restore: RestoreRequest | None = None,
    ) -> int:
        """Advance the run from `expected` by compare-and-swap; the run now current either way.

        `serving`: the pod that serves each task (by id) in the new run (a recovery's: pods it
        keeps, standbys it adopts); `restore`: what the new run's coordinator is asked for (a
        new lineage, an upgrade's plan), in the same transaction as the run.
        """
        registry = Registry(self.backend, layout)
        request = None if restore is None else restore.to_json()
        return self._run(registry.next_run(expected, serving=serving, restore=request))

    def serving(self, layout: Layout, run: int) -> Mapping[str, str] | None:
        """The run's serving map (task id -> pod), None when the run was entered without one."""
        return self._run(Registry(self.backend, layout).serving(run))

    def observe(self, layout: Layout) -> JobInEtcd:
        """Everything a pass reads of the job in etcd, read once: its run, its epoch log, the latest
        durable epoch, the leading coordinator, and the run's serving map and failure reports."""

        async def read() -> JobInEtcd:
            log = EpochLog(self.backend, layout)
            registry = Registry(self.backend, layout)
            run = await registry.current_run()
            entries = tuple(await log.entries())
            durable, durable_at = await log.latest_durable_at()
            leader = await current_leader(self.backend, layout)
            who = None if leader is None else (leader.candidate, leader.token)
            return JobInEtcd(
                run,
                entries,
                durable,
                durable_at,
                who,
                None if leader is None else leader.endpoint,
                serving=await registry.serving(run),
                failed=await registry.failed(run),
            )

        return self._run(read())
