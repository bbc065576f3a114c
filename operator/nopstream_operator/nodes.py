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
"""

from __future__ import annotations

from typing import Any


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
