"""What the exit status of a `nopstream` command means, written once for the CLI and what it runs."""

OK = 0
INVALID = 1
"""Invalid input, a change refused (`diff`), or a start refused (`run`, `status` of no job)."""
USAGE = 2
"""The command was given wrongly (arguments, settings)."""
JOB_FAILED = 3
"""The job cannot start or failed while running."""
INTERNAL = 70
"""An internal error (EX_SOFTWARE): its traceback is written to a file the message names."""
INTERRUPTED = 130
"""Ctrl-C."""
TERMINATED = 143
"""SIGTERM: 128 + its number, as the default action gives."""
