"""Errors of the cluster layer."""

from __future__ import annotations

from nopstream.cluster.backend import LeaseExpired, StoreUnavailable


class Fenced(RuntimeError):
    """A fenced write was refused: the writer is no longer the leader, and must step down."""


__all__ = ["Fenced", "LeaseExpired", "StoreUnavailable"]
