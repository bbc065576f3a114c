"""One run of a job on this machine, from a loaded model: what `nopstream run` and `Job.run()` share.

It checks that the job can start here (its functions import, its directories can be
written), runs it (task processes, in-process, or coordinated through etcd) and turns
every way a run can end badly into one `RunError` whose text is the line a user reads
and whose `exit_code` is the command's exit.
"""

from __future__ import annotations

from dataclasses import dataclass

from nopstream import errors, exits, safefiles
from nopstream.cluster.etcd_access import START_WAIT_S
from nopstream.local import preflight, runner
from nopstream.local.ownership import NamespaceHeld
from nopstream.model.load import LoadedModel
from nopstream.plan import compiler


class RunError(Exception):
    """A run that could not start, restore or finish: `str()` says why in the user's words."""

    exit_code = exits.JOB_FAILED


class CannotStart(RunError):
    """The job cannot start on this machine (a function, a directory, a setting, storage)."""


class CannotRestore(RunError):
    """The job's checkpoints cannot be restored into this plan, or another run holds them."""

    exit_code = exits.INVALID


class BadSettings(RunError):
    """A NOPSTREAM_* setting of the environment is out of its range."""

    exit_code = exits.USAGE


class RunFailed(RunError):
    """A task failed and recoveries did not help, or a record no run can take was read."""


@dataclass(frozen=True)
class Launched:
    """A finished (or stopped) run: the plans it ran and what it reports."""

    plans: compiler.CompiledPlans
    result: runner.RunResult


def launch(
    loaded: LoadedModel,
    options: runner.RunOptions,
    *,
    etcd: str | None = None,
    etcd_wait: float = START_WAIT_S,
) -> Launched:
    """Compile, check and run the job to its end (coordinated through `etcd`, waited for at most `etcd_wait`
    seconds at the start when given); ModelError when it is invalid, RunError when it cannot run or fails."""
    from nopstream.cluster.backend import StoreRefused
    from nopstream.cluster.etcd_access import AccessError, access_from_env
    from nopstream.node.settings import SettingsError
    from nopstream.node.tasklife import task_settings

    plans = compiler.compile_model(loaded)
    job = plans.partitioned.identity.job_id
    try:  # read by every task process: refused here once, rather than failing every task's start
        task_settings()
        if etcd is not None:
            access_from_env()
    except (SettingsError, AccessError) as err:
        raise BadSettings(f"nopstream run: {err}") from None
    issues = preflight.function_issues(loaded, options.python_path) + preflight.machine_issues(loaded)
    if issues:
        lines = "\n".join(f"  {issue}" for issue in issues)
        raise CannotStart(f"job '{job}' cannot start:\n{lines}")
    try:
        if etcd is not None:
            from nopstream.local.supervisor import Supervisor

            return Launched(plans, Supervisor(plans, options, etcd, wait_s=etcd_wait).run())
        return Launched(plans, runner.run_job(plans, options))
    except errors.BadInput as bad:  # a record no run can take: not retried
        raise RunFailed(f"job '{job}' failed: {bad}") from None
    except (errors.StartRefused, StoreRefused) as refused:
        raise CannotStart(f"job '{job}' cannot start: {refused}") from None
    except errors.RestoreRefused as refused:
        raise CannotRestore(f"job '{job}' cannot restore: {refused}") from None
    except NamespaceHeld as held:
        raise CannotRestore(f"job '{job}' cannot run: {held}") from None
    except (errors.StorageError, safefiles.UnsafePath) as err:
        raise CannotStart(f"job '{job}' cannot start: {err}") from None
    except runner.JobFailed as failure:
        raise RunFailed(f"job '{job}' failed: {failure}") from None


def kept(plans: compiler.CompiledPlans) -> str:
    """What a stopped run leaves for the next one, in a sentence: its latest durable epoch, or nothing."""
    from nopstream.checkpoint import catalog, lineage
    from nopstream.node.checkpointing import open_storage

    job = plans.partitioned.identity.job_id
    namespace = plans.partitioned.identity.checkpoint_namespace
    try:
        storage = open_storage(plans.deployment)
        first = lineage.current(storage, namespace).first_epoch
        latest = catalog.Stored.read(storage, namespace).latest_durable(since=first)
    except (OSError, errors.RestoreRefused):  # storage gone too: say what is certain
        return f"job '{job}' resumes from its latest durable epoch when run again"
    if latest is None:
        return f"job '{job}' had no durable epoch yet: running it again starts it from the beginning"
    return (
        f"job '{job}' keeps epoch {latest}, its latest durable one, whose output is committed: running it"
        " again resumes from there"
    )
