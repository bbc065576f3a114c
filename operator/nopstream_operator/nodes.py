"""Which nodes are lost, as the node watch last saw them: their pods are replaced at once.

Kubernetes leaves the pods of a node that stopped answering in place: the node
lifecycle controller calls the node NotReady (Ready `Unknown`) once it misses its
lease renewals for `--node-monitor-grace-period` (50 s by default), and evicts its pods
only 300 s later (the default `node.kubernetes.io/unreachable` toleration), and even
then they stay Terminating until the kubelet answers. The operator does not wait: a
pod of a job on a node whose Ready condition is not True is lost (`decide`), force
deleted and replaced on a node that is Ready. That is safe while the lost node's
processes may still run (a partition, not a crash): a new run fences every write of
the old one (epoch tokens in etcd, restore records in storage).

Before the node is called NotReady (12 s to 50 s), its pods still show Running. A
recovery then, from the failure reports of their peers, would keep them, and the
node's NotReady would be a second recovery. So a recovery first knocks at the pods
it would keep (`silent`): one whose address does not answer within SILENT_S is not
kept, and the new pods prefer the other nodes (`resources.task_pod`).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol


def is_lost(node: dict[str, Any]) -> bool:
    """Whether a Node's Ready condition is there and not True (Unknown: unreachable; False: unwell)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    return ready is not None and ready != "True"


class LostNodes:
    """The names of the lost nodes, kept by the node watch (one operator process's view).

    The watch writes on the event loop and passes read in worker threads: the set is
    replaced whole, never changed in place.
    """

    def __init__(self) -> None:
        """No node is known lost before the watch reports one."""
        self._lost: frozenset[str] = frozenset()

    def seen(self, event_type: str | None, node: dict[str, Any]) -> bool:
        """Record a node event; whether it newly made the node lost."""
        name = node["metadata"]["name"]
        lost = event_type != "DELETED" and is_lost(node)
        newly = lost and name not in self._lost
        self._lost = self._lost | {name} if lost else self._lost - {name}
        return newly

    def names(self) -> frozenset[str]:
        """The nodes lost now."""
        return self._lost


SILENT_S = 1.0
"""How long a knock at a pod's port waits: on a live node a closed port refuses at once."""


class Addressed(Protocol):
    """A pod as `silent` needs it (`observed.PodView`): its name and its address on the pod network."""

    @property
    def name(self) -> str: ...

    @property
    def ip(self) -> str: ...


def silent(pods: Sequence[Addressed], port: int, timeout_s: float = SILENT_S) -> frozenset[str]:
    """The names of `pods` whose address neither accepts nor refuses a TCP connection to `port` within
    `timeout_s` (all knocked at once): their node is gone or cut off. A pod without an address answers."""

    def quiet(pod: Addressed) -> bool:
        if not pod.ip:
            return False
        try:
            socket.create_connection((pod.ip, port), timeout=timeout_s).close()
        except ConnectionRefusedError:  # the pod's node answered for it: its process is between runs
            return False
        except OSError as failed:  # timed out, or no route to the host (its node does not answer ARP)
            return failed.errno in (None, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT)
        return False

    if not pods:
        return frozenset()
    with ThreadPoolExecutor(max_workers=min(len(pods), 16)) as knocking:
        return frozenset(p.name for p, q in zip(pods, knocking.map(quiet, pods), strict=True) if q)
