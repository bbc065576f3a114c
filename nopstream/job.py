"""A job written in Python that runs from Python: `Job` is the builder with `run`, `chaos`, `plan` and
`to_yaml`.

    job = Job("wordcount", parallelism=2)
    ...                                    # sources, operators, sinks as with JobBuilder
    finished = job.run()                   # the embedded default, as `nopstream run`
    finished.output("out")                 # what the sink committed

`run` is `nopstream run` in this process (task processes forked from it, or every
task in it with `in_process=True`): the same checks, engine, checkpoints and messages,
with a `RunError` raised where the command would exit non-zero. Functions may be
defined in the script itself for `run`; whatever leaves this process (`chaos`, a
manifest) needs them importable by module name, and says so in one line when not.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nopstream.checkpoint import catalog
from nopstream.connectors import registry
from nopstream.local import chaos as chaos_runs
from nopstream.local import launch, preflight, runner
from nopstream.local.launch import RunError
from nopstream.model import functions
from nopstream.model.builder import JobBuilder
from nopstream.model.functions import NotImportable
from nopstream.model.load import API_VERSION, KIND, LoadedModel
from nopstream.model.spec import canonical_model
from nopstream.node.checkpointing import open_storage
from nopstream.plan import compiler, render


@dataclass(frozen=True)
class Finished:
    """What a run did: where it began and ended, what flowed, and each sink's committed output."""

    job_id: str
    seconds: float
    runs: int
    """1, plus one for each global recovery."""
    resumed_from: int | None
    """The durable epoch the run restored (None: it started from nothing)."""
    already_finished: bool
    """The job had finished in an earlier run: nothing ran (`fresh=True` starts it over)."""
    stopped_at: int | None
    """The stop savepoint it stopped at (`nopstream savepoint --stop`)."""
    epochs: tuple[int, ...]
    """The durable epochs its checkpoint storage keeps, oldest first."""
    records_in: Mapping[str, int]
    records_out: Mapping[str, int]
    """Records into and out of each vertex in this run."""
    _sinks: Mapping[str, tuple[str, dict[str, Any]]] = field(repr=False)

    @property
    def last_epoch(self) -> int | None:
        """The latest durable epoch (None: none)."""
        return self.epochs[-1] if self.epochs else None

    def output(self, sink_id: str) -> list[Any]:
        """Every record the sink has committed (this run's and earlier runs' of the same output)."""
        if sink_id not in self._sinks:
            raise KeyError(
                f"job '{self.job_id}' has no sink '{sink_id}' (its sinks: {', '.join(self._sinks)})"
            )
        sink_type, config = self._sinks[sink_id]
        read = registry.sink_kind(sink_type).committed
        if read is None:
            raise ValueError(f"sink '{sink_id}' is a {sink_type} sink: it commits nothing to read back")
        return read(config)


@dataclass(frozen=True)
class ChaosReport:
    """A `chaos` run's verdict: its exit code as `nopstream chaos` gives it, and what it printed."""

    code: int
    text: str

    @property
    def exact(self) -> bool:
        """The output under kills equals the failure-free output, and the kills reached what they should."""
        return self.code == 0


class Job(JobBuilder):
    """A JobBuilder that also runs, proves, plans and exports the job it builds."""

    def _loaded(self) -> LoadedModel:
        return LoadedModel(self.build(), f"job '{self._job_id}'", ())

    def plan(self, layer: str = "partitioned", *, format: str = "text") -> str:
        """A compiled plan layer (`stream`, `job`, `partitioned`, `deployment`) as text or JSON, as
        `nopstream plan` prints it; ModelError with every issue when the job is invalid."""
        plan = compiler.compile_model(self._loaded()).layer(layer)
        return compiler.dump_document(plan) if format == "json" else render.render(plan)

    def to_yaml(self, *, name: str | None = None) -> str:
        """A StreamJob manifest of the job (for `kubectl apply`, Helm or `nopstream run`); NotImportable
        when a function is defined in the script being run (`__main__`), which no other process imports."""
        loaded = self._loaded()
        compiler.compile_model(loaded)  # refuse an invalid job first
        spec = canonical_model(loaded.model)
        _refuse_main(loaded, spec)
        spec.pop("jobId", None)
        manifest = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name or self._job_id},
            "spec": spec,
        }
        return yaml.safe_dump(manifest, sort_keys=False)

    def run(
        self,
        *,
        in_process: bool = False,
        workdir: str | Path = ".nopstream",
        fresh: bool = False,
        restore_from: int | None = None,
        max_restarts: int = 10,
        quiet: bool = True,
    ) -> Finished:
        """Run the job to its end on this machine, as `nopstream run` does; RunError (its subclasses
        CannotStart, CannotRestore, RunFailed) when it cannot, ModelError when the job is invalid.

        Not from inside a running event loop (the run has its own).
        """
        if fresh and restore_from is not None:
            raise ValueError("fresh and restore_from exclude each other")
        loaded = self._loaded()
        options = runner.RunOptions(
            in_process=in_process,
            quiet=quiet,
            workdir=Path(workdir),
            restore_from=restore_from,
            fresh=fresh,
            max_restarts=max_restarts,
            drop_state=tuple(loaded.model.drop_state),
        )
        launched = launch.launch(loaded, options)
        plans, result = launched.plans, launched.result
        storage = open_storage(plans.deployment)
        return Finished(
            job_id=plans.partitioned.identity.job_id,
            seconds=result.seconds,
            runs=result.runs,
            resumed_from=result.resumed_from,
            already_finished=result.finished_before is not None,
            stopped_at=result.stopped_at,
            epochs=tuple(catalog.durable_epochs(storage, plans.partitioned.identity.checkpoint_namespace)),
            records_in=result.records_in,
            records_out=result.records_out,
            _sinks={
                # anchored where this run resolved them: `output` reads the same place from anywhere later
                s.id: (s.type, registry.sink_kind(s.type).anchored(dict(s.config)))
                for s in loaded.model.graph.sinks
                if s.id is not None
            },
        )

    def chaos(
        self,
        *,
        kills: int = 10,
        seed: int = 0,
        pace_ms: int = 0,
        allow_shallow: bool = False,
        timeout: float = 600.0,
        workdir: str | Path = ".nopstream/chaos",
    ) -> ChaosReport:
        """Prove the job exactly once as `nopstream chaos` does: a failure-free run, then one under
        seeded SIGKILLs and fault points, their committed outputs compared exactly. RunError when a
        run fails; NotImportable when a function lives in the script being run (`__main__`)."""
        home = Path(workdir)
        home.mkdir(parents=True, exist_ok=True)
        job_file = home / f"{self._job_id}.yaml"
        job_file.write_text(self.to_yaml())
        settings = chaos_runs.ChaosSettings(
            kills=kills,
            seed=seed,
            workdir=home,
            timeout=timeout,
            allow_shallow=allow_shallow,
            pace_ms=pace_ms,
            python_path=tuple(p for p in sys.path if p),
        )
        text = io.StringIO()
        try:
            code = chaos_runs.run_chaos(job_file, settings, out=text)
        except chaos_runs.ChaosFailed as failed:
            raise launch.RunFailed(f"chaos: {failed}") from None
        return ChaosReport(code, text.getvalue())


def _refuse_main(loaded: LoadedModel, spec: dict[str, Any]) -> None:
    """NotImportable for the first function of the script being run (`__main__`) in `spec`, the
    canonical form of `loaded`'s model."""
    for path, ref in preflight.function_refs(spec):
        if ref.startswith(functions.MAIN):
            raise NotImportable(f"{loaded.path(*path)}: {functions.main_function_issue(ref)}")


__all__ = ["ChaosReport", "Finished", "Job", "RunError"]
