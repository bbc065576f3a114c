"""Token checks in tasks: commands from a deposed coordinator are refused.

A task remembers the highest fencing token it has seen on a coordinator command and
refuses any command with a lower one (and says so in its log and its counters): a
coordinator that lost its election can no longer make tasks act.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class TokenGate:
    """Admits coordinator commands whose token is at least the highest seen."""

    def __init__(self) -> None:
        """No token seen yet."""
        self.highest = 0
        self.refused = 0

    def admit(self, token: int, command: str) -> bool:
        """Whether to act on `command` sent with `token`; a lower token is refused and counted."""
        if token < self.highest:
            self.refused += 1
            log.warning("refused %s from a deposed coordinator: token %d < %d", command, token, self.highest)
            return False
        self.highest = token
        return True
