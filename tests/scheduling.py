"""How `make test` shares the tests among its xdist workers: one worker for the cluster's tests alone.

The tests of the Kubernetes cluster (the xdist group "kube") mostly wait: on pods, leases, a
lost node's eviction. On one worker of two they left about a fifth of a 2-core machine idle
(docs/servers.md, "What a CI run costs"); on one of three plain workers the machine was
overloaded once the cluster's tests had ended, and three heavy workers made timed tests fail.
Here the worker that takes the group takes nothing else and ends with it, so that the others
use the cores the cluster leaves idle and no more than they do today afterwards. A run
without the group (a chosen subset) leaves that worker out.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

CLUSTER_GROUP = "kube"


class ClusterAside(LoadGroupScheduling):
    """`--dist loadgroup`, with one of the workers (of two or more) for the cluster's group alone."""

    def schedule(self) -> None:
        """Leave one worker out when no test of the cluster's group was collected; then schedule."""
        if self.collection is None and self.collection_is_completed and self.numnodes > 1:
            collected = next(iter(self.registered_collections.values()))
            if not any(self._split_scope(nodeid) == CLUSTER_GROUP for nodeid in collected):
                spare, _ = self.assigned_work.popitem()
                spare.shutdown()
        super().schedule()

    def _reschedule(self, node: WorkerController) -> None:
        """Give the cluster's worker no more work; it ends once its group's tests are done."""
        if self.numnodes < 2 or CLUSTER_GROUP not in self.assigned_work.get(node, {}):
            super()._reschedule(node)
        elif not node.shutting_down and not self._pending_of(self.assigned_work[node]):
            node.shutdown()
