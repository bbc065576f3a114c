"""Parquet's values as records hold them, and back: what JSON can hold, both ways.

Reading any Parquet file: timestamps become epoch milliseconds (the unit event time
reads; finer ones are cut), dates and times ISO text, decimals text, durations
milliseconds, bytes base64 text, maps objects (a key that is not text as its JSON),
lists and structs lists and objects. Writing, each column of `parquet.schema` takes
the same: `timestamp` epoch milliseconds (a UTC timestamp column), `date` ISO text,
`decimal(P,S)` text or an integer, `binary` base64 text, `json` any value (its JSON
text in a string column); `int32`, `int64` integers only (a float is refused, never
cut), `float`, `double` numbers, `boolean` true or false. A value that does not fit
its column is refused naming the record and the column; null fits every column.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
from typing import Any

import orjson
import pyarrow as pa

from nopstream.connectors.lines import BadRecord
from nopstream.errors import shown_record
from nopstream.model.formats import DECIMAL

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError)


def records_of(table: pa.Table) -> list[dict[str, Any]]:
    """The rows of `table` as records of plain values."""
    columns, walked = [], []
    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        if pa.types.is_dictionary(kind):
            column, kind = column.cast(kind.value_type), kind.value_type
        if pa.types.is_timestamp(kind):
            column = column.cast(pa.timestamp("ms", tz=kind.tz), safe=False).cast(pa.int64())
        elif pa.types.is_duration(kind):
            column = column.cast(pa.duration("ms"), safe=False).cast(pa.int64())
        elif pa.types.is_temporal(kind) or pa.types.is_decimal(kind):
            column = column.cast(pa.string())  # dates and times as ISO text
        elif pa.types.is_nested(kind) or _is_binary(kind):
            walked.append(name)
        columns.append(column)
    records: list[dict[str, Any]] = pa.Table.from_arrays(columns, names=table.column_names).to_pylist()
    for name in walked:
        for record in records:
            record[name] = _plain(record[name])
    return records


def _is_binary(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)
    )


def _plain(value: Any) -> Any:
    """A value pyarrow made of a nested or binary column, as JSON holds it."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) for v in value):  # a map's entries
            return {_key(k): _plain(v) for k, v in value}
        return [_plain(v) for v in value]
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)
        return (moment - _EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return str(value)


def _key(key: Any) -> str:
    return key if isinstance(key, str) else orjson.dumps(_plain(key)).decode("utf-8")


def arrow_type(kind: str) -> pa.DataType:
    """The Arrow type of a `parquet.schema` column type."""
    decimal_type = DECIMAL.match(kind)
    if decimal_type is not None:
        return pa.decimal128(int(decimal_type[1]), int(decimal_type[2]))
    return _TYPES[kind]


_TYPES = {
    "string": pa.string(),
    "json": pa.string(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("ms", tz="UTC"),
    "date": pa.date32(),
    "binary": pa.binary(),
}

# what a column of each type takes, as pyarrow types the values given (null: every value None)
_TAKES = {
    "string": (pa.string(),),
    "int32": (pa.int64(),),
    "int64": (pa.int64(),),
    "timestamp": (pa.int64(),),
    "float": (pa.int64(), pa.float64()),
    "double": (pa.int64(), pa.float64()),
    "boolean": (pa.bool_(),),
    "date": (pa.string(),),
    "decimal": (pa.string(), pa.int64()),
}


class ParquetSchema:
    """The columns a sink writes: each record becomes a row of them."""

    def __init__(self, schema: dict[str, str]) -> None:
        """The columns of `parquet.schema`, in order."""
        self.columns = list(schema.items())
        self.names = set(schema)
        self.arrow = pa.schema([(name, arrow_type(kind)) for name, kind in self.columns])

    def table(self, records: list[Any]) -> pa.Table:
        """The records as a table of the schema; BadRecord naming the first that does not fit."""
        for record in records:
            if not isinstance(record, dict):
                kind = type(record).__name__
                raise BadRecord(
                    f"the record {shown_record(record)} is a {kind}, not a record of fields"
                    " (rule: format parquet writes records)"
                )
            if not record.keys() <= self.names:
                extra = ", ".join(sorted(map(str, record.keys() - self.names)))
                raise BadRecord(
                    f"the record {shown_record(record)} has fields that are not among parquet.schema: {extra}"
                )
        arrays = []
        for (name, kind), target in zip(self.columns, self.arrow.types, strict=True):
            values = [r.get(name) for r in records]
            try:
                arrays.append(_column(values, kind, target))
            except _Unfit:
                raise _first_unfit(records, name, kind, target) from None
        return pa.Table.from_arrays(arrays, schema=self.arrow)


class _Unfit(ValueError):
    """Some value does not fit its column."""


def _column(values: list[Any], kind: str, target: pa.DataType) -> pa.Array:
    """The values as a column of `target`; _Unfit when one does not fit."""
    if kind == "json":
        return pa.array([None if v is None else orjson.dumps(v).decode("utf-8") for v in values], target)
    if kind == "binary":
        try:
            decoded = [None if v is None else base64.b64decode(v, validate=True) for v in values]
        except (binascii.Error, TypeError, ValueError):
            raise _Unfit from None
        return pa.array(decoded, target)
    try:
        given = pa.array(values)
        takes = _TAKES["decimal" if pa.types.is_decimal(target) else kind]
        if given.type != pa.null() and given.type not in takes:
            raise _Unfit
        return given.cast(target)
    except _ARROW_ERRORS:
        raise _Unfit from None


def _first_unfit(records: list[Any], name: str, kind: str, target: pa.DataType) -> BadRecord:
    """The refusal of the first record whose `name` does not fit a column of `kind`."""
    for record in records:
        value = record.get(name)
        try:
            _column([value], kind, target)
        except _Unfit:
            what = "base64 text" if kind == "binary" else kind
            return BadRecord(
                f"the record {shown_record(record)} has {name} = {shown_record(value)[:60]}, which is not"
                f" {what} (rule: parquet.schema gives each column's type)"
            )
    return BadRecord(f"the values of {name} do not fit a {kind} column together (rule: parquet.schema)")
