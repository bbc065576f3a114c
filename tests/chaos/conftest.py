"""The chaos suite: `nopstream chaos` run as a user runs it, on the job shapes of `jobs.py`."""
