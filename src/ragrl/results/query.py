"""Read-only access to the results database, and the SQL quoting helpers the other modules use.

`query()` is what `ragrl query` runs: it opens the DuckDB file read-only (so a query can never
damage the database the workflow built) and sandboxed, runs one SQL text and prints or writes the
result. Sandboxed: external access is off and the configuration is locked (`SANDBOX`), so a query
reads the results database and nothing else: `COPY ... TO`, `EXPORT DATABASE`, `read_text` /
`read_csv` of other files, `ATTACH`, `INSTALL` / `LOAD` fail with DuckDB's permission error, and
`SET` cannot turn access back on. Writing the result is `query()`'s job (`out`), not SQL's.

Output formats:

* ``table``   an aligned text table on stdout (or in `out`); floats shown with 6 significant
              digits, long text cut at 60 characters, NULL shown as ``NULL``.
* ``csv``     header + rows; NULL is an empty field, floats are written with `repr` (they parse
              back to the exact stored value), lists/structs as compact JSON.
* ``json``    a JSON array of objects (one per row, keys in column order); NULL and non-finite
              floats become ``null``, JSON columns are embedded as JSON rather than as strings.
* ``parquet`` the result as an Arrow table written with `ragrl.io.write_parquet`; needs `out`.

Every failure (missing file, SQL error) raises `ValueError` / `FileNotFoundError` with a one-line
message, which the CLI prints without a traceback.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
import math
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from ragrl.errors import InputError

FORMATS = ("table", "csv", "json", "parquet")
_MAX_CELL = 60


# --------------------------------------------------------------------------------------------
# SQL quoting
# --------------------------------------------------------------------------------------------

def sql_literal(value: str | os.PathLike) -> str:
    """Quote `value` as a SQL string literal: ``it's`` -> ``'it''s'``.

    DuckDB string literals have no backslash escapes, so doubling the single quote is the whole
    job. Used only where a parameter is impossible (view definitions); file paths and file
    contents go in as prepared-statement parameters.
    """
    text = os.fspath(value)
    if not isinstance(text, str):
        raise TypeError(f"sql_literal needs a string, got {type(text).__name__}")
    if "\x00" in text:
        raise ValueError(f"cannot quote a string containing a NUL character as SQL: {text!r}")
    return "'" + text.replace("'", "''") + "'"


def quote_ident(name: str) -> str:
    """Quote `name` as a SQL identifier: ``a"b`` -> ``"a""b"``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"invalid SQL identifier: {name!r}")
    if "\x00" in name:
        raise ValueError(f"cannot quote an identifier containing a NUL character: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def write_utf8(text: str, path: str | os.PathLike) -> None:
    """Write `text` atomically as UTF-8 (whatever the locale), via `ragrl.io.atomic_path`."""
    from ragrl.io import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def one_line(exc: BaseException) -> str:
    """DuckDB's message without the multi-line `LINE 1: ... ^^^` pointer, on one line."""
    lines = []
    for line in str(exc).splitlines():
        if line.startswith("LINE ") or not line.strip():
            break
        lines.append(line.strip())
    return " ".join(lines) or type(exc).__name__


# --------------------------------------------------------------------------------------------
# connections
# --------------------------------------------------------------------------------------------

# DuckDB settings for every read-only connection: no files, extensions or network beyond the
# database itself, and no SET/PRAGMA that could undo that.
SANDBOX = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,
}


def connect_read_only(db_path: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """The results database, read-only and sandboxed (`SANDBOX`)."""
    path = Path(db_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: results database not found")
    try:
        return duckdb.connect(str(path), read_only=True, config=dict(SANDBOX))
    except duckdb.Error as exc:
        raise InputError(f"{path}: cannot open results database: {one_line(exc)}") from exc


def fetch(db_path: str | os.PathLike, sql: str, params: Sequence[Any] | None = None
          ) -> tuple[list[str], list[tuple]]:
    """Run `sql` read-only and return (column names, rows)."""
    con = connect_read_only(db_path)
    try:
        cur = con.execute(sql, list(params or []))
        columns = [d[0] for d in cur.description or []]
        return columns, cur.fetchall()
    except duckdb.Error as exc:
        raise InputError(f"query failed: {one_line(exc)}") from exc
    finally:
        con.close()


# --------------------------------------------------------------------------------------------
# value conversion
# --------------------------------------------------------------------------------------------

def _jsonable(value: Any, is_json: bool = False) -> Any:
    if value is None:
        return None
    if is_json and isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        return float(value) if value.is_finite() else None
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, uuid.UUID | dt.timedelta):
        return str(value)
    return str(value)


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict | list | tuple):
        return json.dumps(_jsonable(value), ensure_ascii=False, separators=(",", ":"))
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    return str(value)


def _table_cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        text = f"{value:.6g}"
    else:
        text = _csv_cell(value)
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    if len(text) > _MAX_CELL:
        text = text[: _MAX_CELL - 1] + "…"
    return text


def format_text_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table: numbers right-aligned, everything else left-aligned."""
    cells = [[_table_cell(v) for v in row] for row in rows]
    numeric = [
        all(isinstance(row[i], int | float | decimal.Decimal) and not isinstance(row[i], bool)
            for row in rows if row[i] is not None)
        for i in range(len(columns))
    ]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)
        ).rstrip()

    out = [line(columns), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# query
# --------------------------------------------------------------------------------------------

def query(db_path: str | os.PathLike, sql: str, fmt: str = "table",
          out: str | os.PathLike | None = None) -> None:
    """Run `sql` against the results database (read-only) and print or write the result."""
    from ragrl.io import write_parquet

    if fmt not in FORMATS:
        raise InputError(f"unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "parquet" and out is None:
        raise InputError("parquet output needs an output file (--out)")
    con = connect_read_only(db_path)
    try:
        try:
            rel = con.sql(sql)
            if rel is None:  # a statement without a result set
                columns, types, rows, arrow = [], [], [], None
            elif fmt == "parquet":
                columns, types, rows = list(rel.columns), [str(t) for t in rel.types], []
                arrow = rel.to_arrow_table()
            else:
                columns, types, arrow = list(rel.columns), [str(t) for t in rel.types], None
                rows = rel.fetchall()
        except duckdb.PermissionException as exc:
            raise InputError(f"query failed: {one_line(exc)} (ragrl query reads the results database only; "
                             "use --out to write the result)") from exc
        except duckdb.Error as exc:
            raise InputError(f"query failed: {one_line(exc)}") from exc
    finally:
        con.close()

    if fmt == "parquet":
        if arrow is None:
            raise InputError("query failed: the statement returned no result set to write")
        write_parquet(arrow, out)
        return
    if fmt == "table":
        text = format_text_table(columns, rows) if columns else ""
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        if columns:
            writer.writerow(columns)
            writer.writerows([_csv_cell(v) for v in row] for row in rows)
        text = buf.getvalue()
    else:
        is_json = [t == "JSON" for t in types]
        records = [
            {c: _jsonable(v, j) for c, v, j in zip(columns, row, is_json)} for row in rows
        ]
        text = json.dumps(records, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_utf8(text, out)
