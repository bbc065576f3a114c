"""The HTTP lookup of `type: lookup` (`kind: http`): GET a URL made from the record, its JSON body."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

_FIELD = re.compile(r"\{([^{}]+)\}")


class HttpLookup:
    """GET a URL made from the record; its JSON body."""

    def __init__(self, spec: dict[str, Any]) -> None:
        """Read the URL template."""
        self.url: str = spec["url"]
        self._session: Any = None

    def key(self, record: Any) -> str:
        """The URL of `record` (its fields URL-quoted)."""
        return _FIELD.sub(lambda m: quote(str(record[m.group(1)]), safe=""), self.url)

    async def fetch(self, key: str) -> Any:
        """The JSON body at `key` (null on 404); an error status raises."""
        import aiohttp  # imported by the jobs that look things up over HTTP

        if self._session is None:  # made on the task's loop, at its first call
            self._session = aiohttp.ClientSession()
        async with self._session.get(key) as response:
            if response.status == 404:
                return None
            response.raise_for_status()
            return await response.json()

    async def close(self) -> None:
        """Close the session, if a call made one."""
        if self._session is not None:
            await self._session.close()
