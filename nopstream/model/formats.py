"""How the file and s3 connectors hold records in objects: lines (text, JSON, CSV) or Parquet."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, StrictInt, field_validator, model_validator

from nopstream.model.connector_config import ConnectorConfig

ObjectFormatName = Literal["text", "jsonl", "csv", "parquet"]

PARQUET_TYPES = (
    "string",
    "int32",
    "int64",
    "float",
    "double",
    "boolean",
    "timestamp",
    "date",
    "binary",
    "json",
)
"""The column types a Parquet sink writes; `decimal(P,S)` too (see `ParquetWriteOptions`)."""

DECIMAL = re.compile(r"^decimal\((\d{1,2}),(\d{1,2})\)$")
"""A decimal column type: precision 1-38, scale 0-precision."""


class CsvOptions(ConnectorConfig):
    """CSV lines (RFC 4180 quoting, a record per line). Reading, each object's first line is its header
    and names the fields, whose values are text unless `types` says `int`, `float` or `bool`; writing,
    `columns` are the header and the fields written, in order."""

    delimiter: str = Field(",", min_length=1, max_length=1)
    columns: list[str] | None = Field(None, min_length=1, max_length=10_000)
    types: dict[str, Literal["int", "float", "bool"]] = Field(default_factory=dict)


class ParquetReadOptions(ConnectorConfig):
    """Reading Parquet: `columns` read (all of them without)."""

    columns: list[str] | None = Field(None, min_length=1, max_length=10_000)


class ParquetColumn(ConnectorConfig):
    """A column a Parquet sink writes: its `name` and `type` (`PARQUET_TYPES` or `decimal(P,S)`)."""

    name: str = Field(min_length=1, max_length=1000)
    type: str

    @field_validator("type")
    @classmethod
    def _known_type(cls, kind: str) -> str:
        decimal = DECIMAL.match(kind)
        if decimal is not None and 1 <= int(decimal[1]) <= 38 and int(decimal[2]) <= int(decimal[1]):
            return kind
        if kind not in PARQUET_TYPES:
            raise ValueError(
                f"'{kind}' is not a Parquet column type: one of {', '.join(PARQUET_TYPES)}"
                " or decimal(P,S) with 1 <= P <= 38 and S <= P"
            )
        return kind


class ParquetWriteOptions(ConnectorConfig):
    """Writing Parquet: `schema` lists the columns in order, each with its type; a record's fields are
    its columns' values (a missing one is null, one outside the schema is refused). A row group holds
    `rowGroupRows` rows (the last of a file fewer)."""

    schema_: list[ParquetColumn] = Field(alias="schema", min_length=1, max_length=10_000)
    compression: Literal["snappy", "zstd", "gzip", "none"] = "snappy"
    row_group_rows: StrictInt = Field(65_536, ge=1, le=10_000_000)

    @field_validator("schema_")
    @classmethod
    def _names_once(cls, schema: list[ParquetColumn]) -> list[ParquetColumn]:
        names = [c.name for c in schema]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"column {', '.join(twice)} is listed twice")
        return schema

    def columns(self) -> dict[str, str]:
        """Each column's type, in order."""
        return {c.name: c.type for c in self.schema_}


class ObjectFormatConfig(ConnectorConfig):
    """Records in objects: `text`, `jsonl` (a JSON value a line), `csv` (with its `csv` options) or
    `parquet` (with its `parquet` options)."""

    format: ObjectFormatName = "jsonl"
    csv: CsvOptions | None = None

    @model_validator(mode="after")
    def _options_with_their_format(self) -> ObjectFormatConfig:
        for options in ("csv", "parquet"):
            if getattr(self, options, None) is not None and self.format != options:
                raise ValueError(f"{options} goes with format {options}, not {self.format}")
        return self

    def csv_options(self) -> CsvOptions:
        """The CSV options given, else the defaults."""
        return self.csv or CsvOptions()


class ObjectSourceFormatConfig(ObjectFormatConfig):
    """A source of objects: Parquet may name the columns read."""

    parquet: ParquetReadOptions | None = None


class ObjectSinkFormatConfig(ObjectFormatConfig):
    """A sink of objects: CSV names its `csv.columns`, Parquet its `parquet.schema`."""

    parquet: ParquetWriteOptions | None = None

    @model_validator(mode="after")
    def _sink_names_its_columns(self) -> ObjectSinkFormatConfig:
        if self.format == "csv" and (self.csv is None or self.csv.columns is None):
            raise ValueError("format csv needs csv.columns (the header, and the fields written in order)")
        if self.csv is not None and self.csv.types:
            raise ValueError("csv.types is for reading: a sink writes each value as its text")
        if self.format == "parquet" and self.parquet is None:
            raise ValueError("format parquet needs parquet.schema (each column's type, in order)")
        return self
