"""The one client of a coordinator's routes for callers outside the job: the CLI and the operator.

Blocking (both callers are): `nopstream savepoint` and `nopstream status` ask the
coordinator of a local or `--etcd` run, the operator asks the leading coordinator of a
StreamJob for a savepoint. The tasks' own client is `coordinator_api.CoordinatorLink`.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from nopstream.node.wire import guard


class CoordinatorError(Exception):
    """A request the coordinator did not take; the message says why."""


class Refused(CoordinatorError):
    """The coordinator answered, and said no."""

    def __init__(self, path: str, status: int, why: str) -> None:
        """Request `path` refused with HTTP `status` and its text `why`."""
        self.status = status
        super().__init__(f"refused {path} ({status}): {why}")


class Unreachable(CoordinatorError):
    """The coordinator did not answer."""


@dataclass(frozen=True)
class CoordinatorClient:
    """Requests to the coordinator at `base` (a URL), with the job's secret (an https URL: over TLS with
    `tls`, a client context of `node.wire.tls`)."""

    base: str
    secret: str = field(repr=False)
    timeout: float = 10.0
    tls: ssl.SSLContext | None = None

    def savepoint(self, *, stop: bool = False) -> tuple[int, ...]:
        """Make the next epoch a savepoint (`stop`: and stop the job at it); the savepoints so far."""
        answer = self._ask("POST", "/savepoint?stop=true" if stop else "/savepoint")
        return tuple(int(epoch) for epoch in answer.get("savepoints", []))

    def job_view(self) -> dict[str, Any]:
        """The job's view (`node.view.jobview`), as the dashboard reads it."""
        return self._ask("GET", "/api/v1/job")

    def _ask(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.base.rstrip('/')}{path}", method=method, headers=guard.headers(self.secret)
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.tls) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as refused:
            raise Refused(path, refused.code, refused.read().decode(errors="replace")) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise Unreachable(f"did not answer {path}: {err}") from None
        if not isinstance(answer, dict):
            raise Unreachable(f"answered {path} with {type(answer).__name__}, not an object")
        return answer
