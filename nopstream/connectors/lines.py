"""Records as lines, the way the file, s3 and stdout connectors read and write them.

Three formats: `jsonl` (one JSON value per line; blank lines skipped on reading), `text`
(one string per line, without its line ending) and `csv` (Python's `csv` module,
RFC 4180 quoting, one record per line: an object's first line is its header; a field
with a line break inside its quotes cannot be read, as objects are cut into stripes at
line ends). Reading CSV, a record is a mapping of the header's names to text values,
`types` turning named fields into int, float or bool; writing, the `columns` in order,
None as an empty field, true and false as such, a list or mapping as JSON text.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from nopstream.errors import shown_record
from nopstream.model.formats import CsvOptions, ObjectFormatConfig


class BadLine(ValueError):
    """Line `index` of the lines given is not a record of the format; `reason` says why."""

    def __init__(self, index: int, reason: str) -> None:
        """Line `index` (0-based) is bad for `reason`."""
        super().__init__(f"line {index}: {reason}")
        self.index = index
        self.reason = reason


class BadRecord(ValueError):
    """A record the format cannot write; the message says why."""


_FORMS = {"jsonl": "JSON lines", "text": "UTF-8 text lines", "csv": "CSV lines"}
_EXTS = {"jsonl": "jsonl", "text": "txt", "csv": "csv"}


class LineFormat:
    """One of the line formats with its options."""

    def __init__(self, fmt: str, options: CsvOptions | None = None) -> None:
        """Format `fmt` (`jsonl`, `text`, `csv`); CSV with `options` (the defaults without)."""
        self.format = fmt
        self.csv = options or CsvOptions()
        self.form = _FORMS[fmt]
        self.ext = _EXTS[fmt]

    @classmethod
    def of(cls, config: ObjectFormatConfig) -> LineFormat:
        """The format a connector's config names."""
        return cls(config.format, config.csv_options())

    @property
    def has_header(self) -> bool:
        """Whether an object's first line is a header, not a record."""
        return self.format == "csv"

    def header(self) -> bytes:
        """The header line a writer starts each object with (empty for formats without one)."""
        if self.format != "csv":
            return b""
        assert self.csv.columns is not None  # a sink's config requires them
        return self._csv_line(self.csv.columns)

    def encode(self, records: list[Any]) -> bytes:
        """The records as lines, each ended by a newline; BadRecord for one CSV cannot write."""
        if self.format == "jsonl":
            return b"".join(orjson.dumps(r) + b"\n" for r in records)
        if self.format == "text":
            return "".join(f"{r}\n" for r in records).encode("utf-8")
        out = []
        for record in records:
            try:
                out.append(self._csv_line(self._row(record)))
            except BadRecord as err:
                raise BadRecord(f"the record {shown_record(record)} {err}") from None
        return b"".join(out)

    def writer(self) -> LinesWriter:
        """The writer of one object of these lines."""
        return LinesWriter(self)

    def records(self, data: bytes) -> list[Any]:
        """The records of a whole object a sink wrote (its header first, for CSV)."""
        lines = data.splitlines()
        if not self.has_header:
            return self.decode(lines)
        return self.decode(lines[1:], fields=self.fields(lines[0]) if lines else [])

    def _csv_line(self, values: Sequence[str]) -> bytes:
        out = io.StringIO()
        csv.writer(out, delimiter=self.csv.delimiter, lineterminator="\n").writerow(values)
        return out.getvalue().encode("utf-8")

    def _row(self, record: Any) -> list[str]:
        columns = self.csv.columns
        assert columns is not None
        if not isinstance(record, dict):
            kind = type(record).__name__
            raise BadRecord(f"is a {kind}, not a record of fields (rule: format csv writes records)")
        extra = sorted(set(record) - set(columns))
        if extra:
            raise BadRecord(f"has fields that are not among csv.columns: {', '.join(map(str, extra))}")
        return [_csv_text(record.get(c)) for c in columns]

    def fields(self, header: bytes) -> list[str]:
        """The field names of a header line."""
        if not header.strip():
            return []
        return self._csv_values(header)

    def _csv_values(self, line: bytes) -> list[str]:
        text = line.decode("utf-8").rstrip("\r\n")
        if "\n" in text or "\r" in text:
            raise ValueError("has a line break inside it")
        rows = list(csv.reader([text], delimiter=self.csv.delimiter, strict=True))
        return rows[0] if rows else []

    def decode(
        self,
        lines: list[bytes],
        *,
        fields: list[str] | None = None,
        unreadable: Callable[[int, bytes, str], Any] | None = None,
    ) -> list[Any]:
        """The records of whole lines (each with or without its line ending; CSV's under the header's
        `fields`); BadLine naming the first bad one, or, given `unreadable`, `unreadable(index, line,
        reason)` in place of each bad one."""
        try:
            if self.format == "jsonl":
                return [orjson.loads(line) for line in lines if line.strip()]
            if self.format == "text":
                return [line.decode("utf-8").rstrip("\r\n") for line in lines]
            fast = self._csv_records(lines, fields or [])
            if fast is not None:
                return fast
        except (ValueError, csv.Error):  # found again line by line, off the fast path
            pass
        records: list[Any] = []
        for i, line in enumerate(lines):
            try:
                if self.format == "text":
                    records.append(line.decode("utf-8").rstrip("\r\n"))
                elif self.format == "jsonl":
                    if line.strip():
                        records.append(orjson.loads(line))
                elif line.strip():
                    records.append(self._csv_record(line, fields or []))
            except UnicodeDecodeError as err:
                why = f"is not UTF-8 ({err.reason} at byte {err.start} of the line)"
            except orjson.JSONDecodeError as err:
                why = f"is not JSON ({err})"
            except (csv.Error, ValueError) as err:
                why = f"is not a CSV record of the header's {len(fields or [])} fields ({err})"
            else:
                continue
            if unreadable is None:
                raise BadLine(i, why) from None
            records.append(unreadable(i, line, why))
        return records

    def _csv_records(self, lines: list[bytes], fields: list[str]) -> list[dict[str, Any]] | None:
        """The records of CSV lines read by one reader (the fast path); None when a line is not one
        record of the header's fields (a quote left open joins lines: then they are read one by one)."""
        texts = [line.decode("utf-8") for line in lines if line.strip()]
        rows = list(csv.reader(texts, delimiter=self.csv.delimiter, strict=True))
        width = len(fields)
        if len(rows) != len(texts) or any(len(row) != width for row in rows):
            return None
        records: list[dict[str, Any]] = [dict(zip(fields, row, strict=True)) for row in rows]
        for name, kind in self.csv.types.items():
            if name in fields:
                for record in records:
                    record[name] = _typed(name, record[name], kind)
        return records

    def _csv_record(self, line: bytes, fields: list[str]) -> dict[str, Any]:
        values = self._csv_values(line)
        if len(values) != len(fields):
            raise ValueError(f"it has {len(values)}")
        record: dict[str, Any] = dict(zip(fields, values, strict=True))
        for name, kind in self.csv.types.items():
            if name in record:
                record[name] = _typed(name, record[name], kind)
        return record


def _csv_text(value: Any) -> str:
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode("utf-8")
    return str(value)


def _typed(name: str, text: str, kind: str) -> Any:
    """A CSV value as csv.types says (an empty one as None)."""
    if text == "":
        return None
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        raise ValueError(f"field {name} is '{text[:50]}', not {kind}") from None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise ValueError(f"field {name} is '{text[:50]}', not true or false")


class LinesWriter:
    """One object's lines as they are written: the header (CSV's) first."""

    def __init__(self, fmt: LineFormat) -> None:
        """An object of `fmt`, nothing written yet."""
        self.format = fmt
        self._begun = False

    def add(self, records: list[Any]) -> bytes:
        """The bytes of `records` that follow what was written; BadRecord for one the format cannot write."""
        data = self.format.encode(records)
        if self._begun:
            return data
        self._begun = True
        return self.format.header() + data

    def end(self) -> bytes:
        """Nothing: lines need no end."""
        return b""
