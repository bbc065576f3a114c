"""Where each coordination record lives (docs/coordination.md).

Under `/nopstream/{namespace}/{jobId}/{pipelineId}/`:
  coordinator                    the elected coordinator (bound to its lease)
  run                            the current run, advanced by compare-and-swap
  runs/{run}/tasks/{taskId}      a task's registration (bound to the task's lease)
  runs/{run}/restore             the epoch the run's tasks restore (fenced, set once per run)
  runs/{run}/serving             the pod that serves each task in the run (written with the run by a
                                 recovery that keeps pods; absent: the pods made for the run)
  runs/{run}/failed/{taskId}     a task process of a kept pod failed in the run (its pod lives on)
  epochs/{epoch:020d}            an epoch-log entry (fenced writes)
  latest-durable                 the latest durable epoch (fenced writes)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """The keys of one job's coordination records."""

    namespace: str
    job_id: str
    pipeline_id: str

    @property
    def prefix(self) -> str:
        """The job's root."""
        return f"/nopstream/{self.namespace}/{self.job_id}/{self.pipeline_id}/"

    @property
    def coordinator(self) -> str:
        """The election key."""
        return self.prefix + "coordinator"

    @property
    def run(self) -> str:
        """The current run."""
        return self.prefix + "run"

    def tasks(self, run: int) -> str:
        """The registry prefix of a run."""
        return f"{self.prefix}runs/{run}/tasks/"

    def task(self, run: int, task_id: str) -> str:
        """A task's registration key (task ids contain '/', kept as they are)."""
        return self.tasks(run) + task_id

    def restore(self, run: int) -> str:
        """The run's restore point, chosen by the coordinator before the run's first epoch (fenced)."""
        return f"{self.prefix}runs/{run}/restore"

    def restore_request(self, run: int) -> str:
        """What the operator or `nopstream run --etcd` asks the run's coordinator to restore from."""
        return f"{self.prefix}runs/{run}/restore-request"

    def serving(self, run: int) -> str:
        """Which pod serves each task in the run: written with the run, and by a recovery only."""
        return f"{self.prefix}runs/{run}/serving"

    def failures(self, run: int) -> str:
        """The prefix of the run's failure reports (`failed`)."""
        return f"{self.prefix}runs/{run}/failed/"

    def failed(self, run: int, task_id: str) -> str:
        """The report that a task process of a kept pod failed in the run (`node.resident`)."""
        return self.failures(run) + task_id

    @property
    def epochs(self) -> str:
        """The epoch-log prefix."""
        return self.prefix + "epochs/"

    def epoch(self, epoch: int) -> str:
        """An epoch's log key; zero-padded so keys sort by epoch."""
        return f"{self.epochs}{epoch:020d}"

    @property
    def latest_durable(self) -> str:
        """The latest-durable pointer."""
        return self.prefix + "latest-durable"


def operator_pass(namespace: str, name: str) -> str:
    """The key an operator holds while it runs a pass over StreamJob `namespace/name`."""
    return f"/nopstream-operator/passes/{namespace}/{name}"
