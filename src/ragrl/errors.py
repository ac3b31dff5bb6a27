"""Errors that point at the exact place in an input file that needs fixing.

Corpora are tens of gigabytes; "invalid input" without a file and line means hours of bisecting.
The message format `path:line: field 'x': what is wrong` is the one editors and terminals already
turn into clickable locations.
"""

from __future__ import annotations

import os


class RagrlError(Exception):
    """The base of every failure the user can fix: bad input or config, a busy work directory, an
    endpoint that answered nothing usable. The CLI prints such an error's message on one line and
    exits 2 (`ragrl --debug ...` prints the traceback too); any other exception is a bug and keeps
    its traceback."""


class InputError(RagrlError, ValueError):
    """A value in the user's config, recipe or input files is wrong. Also a ValueError, so that code
    and tests that catch ValueError around settings and readers keep working."""


class DataFormatError(InputError):
    """A malformed input record.

    `line` is 1-based (None where the format has no useful line numbers, e.g. a JSON array read
    whole; `record` then gives the 0-based array index). `field` names the offending field, with
    a path such as `context[2]` for nested values, or is None for whole-record problems.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        message: str,
        *,
        line: int | None = None,
        field: str | None = None,
        record: int | None = None,
    ) -> None:
        self.path = str(path)
        self.message = message
        self.line = line
        self.field = field
        self.record = record
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.path if self.line is None else f"{self.path}:{self.line}"]
        if self.record is not None:
            parts.append(f"record {self.record}")
        if self.field is not None:
            parts.append(f"field '{self.field}'")
        parts.append(self.message)
        return ": ".join(parts)

    # Keyword-only arguments would be lost by the default pickling, which Snakemake and
    # multiprocessing use to carry exceptions between processes.
    def __reduce__(self):
        return (_rebuild, (self.path, self.message, self.line, self.field, self.record))


def _rebuild(path, message, line, field, record) -> DataFormatError:
    return DataFormatError(path, message, line=line, field=field, record=record)
