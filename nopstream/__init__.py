"""nopstream: exactly-once stream processing on Kubernetes, and on one machine.

`Job` builds a job in Python and runs it (`nopstream.job`); `nopstream.testing` gives it
input and collects its output in tests. They are imported when first named, so that a
task process, which needs neither, does not pay for them.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Job": "nopstream.job",
    "Finished": "nopstream.job",
    "ChaosReport": "nopstream.job",
    "JobBuilder": "nopstream.model.builder",
    "Stream": "nopstream.model.builder",
    "ModelError": "nopstream.model.errors",
    "NotImportable": "nopstream.model.functions",
    "RunError": "nopstream.local.launch",
    "CannotStart": "nopstream.local.launch",
    "CannotRestore": "nopstream.local.launch",
    "RunFailed": "nopstream.local.launch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """The public names, each from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'nopstream' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
