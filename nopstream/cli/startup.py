"""A command's start: the garbage collector is off while its modules load, on once they are loaded.

Loading the modules of `nopstream run` makes long-lived objects only (classes, pydantic
schemas, functions), and collecting while they come was about a fifth of the imports' CPU
(docs/runtime.md). `nopstream.__main__`, the entry of the console script and of
`python -m nopstream`, turns the collector off before anything loads; a command that
loads modules of its own calls `loaded` after its imports, and `cli.main` calls it for
the others.
"""

from __future__ import annotations

import gc


def loaded() -> None:
    """The command's modules are loaded: what they made is kept out of every later collection (none
    of it is garbage), and garbage is collected from now on. Nothing when the collector is on
    already (the command called from Python, not from the command line)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
