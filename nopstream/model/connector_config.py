"""The base of every connector's config: how its keys are spelled and what it says of its place."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ConnectorConfig(BaseModel):
    """Base of every connector config: camelCase keys, unknown keys refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    def rows_replace_by_key(self) -> bool:
        """Whether a row replaces the earlier row of its key (upsert): then their order matters."""
        return False

    def location(self) -> str | None:
        """Where a sink writes, in words equal for equal places; None for a sink with no place of its own."""
        return None
