"""Errors of the checkpoint layer; each message names the object and the epoch."""

from __future__ import annotations


class StorageError(OSError):
    """Checkpoint storage could not be read or written."""


class RestoreRefused(RuntimeError):
    """A checkpoint cannot be restored: damaged, missing, or made for another plan."""


class StartRefused(RestoreRefused):
    """A run cannot start as configured (a sink's table is missing, say): no restart can fix it."""
