"""Parse the content of one `<kg-query>…</kg-query>` into a function call, as KG-R1 accepts it.

    get_entities_out("Ada Lovelace", "place of birth")    double quotes (preferred)
    get_entities_out('Ada Lovelace', 'place of birth')    single quotes
    get_entities_out(Ada Lovelace, place of birth)        unquoted (trimmed; no commas inside)
    get_tail_entities("Washington, D.C.", "capital of")   commas inside quotes; legacy names
    "get_relations_out(\"Ada\")"                          a whole call wrapped in quotes (KG-R1 strips it)

A hand-written scanner, not a regex, so that a 10k-character string costs one linear pass and
error messages can say exactly what is wrong (wrong arity, unknown function with the nearest
known name, unterminated quote, text after the call). `parse_query` never raises: anything that
is not a valid call becomes a `QueryFormatError` whose message is shown to the model.

Arguments are plain strings used only as lookup keys by the KG store; nothing here evaluates
them.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ragrl.kg.ops import ALL_NAMES, OPERATIONS, USAGE, canonical_name
from ragrl.kg.store import fold

MAX_QUERY_CHARS = 16_384  # longer content is rejected before scanning
MAX_ARG_CHARS = 256  # = OpLimits.max_arg_chars; also keeps requests far below the server's field limit
_NAME_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]*)\s*\(")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
# Opening quote -> closing quote; models sometimes emit typographic quotes.
_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}


@dataclass(frozen=True)
class KGQuery:
    fn: str  # canonical operation name
    args: tuple[str, ...]
    called: str  # the function name as written (legacy names stay legacy in messages)

    @property
    def key(self) -> tuple[str, ...]:
        """Identity for "was this query already asked?": canonical op, case- and space-insensitive args."""
        return (self.fn, *(fold(a) for a in self.args))

    def to_request(self, dataset_name: str | None = None, sample_id: str | None = None) -> dict:
        """KG-R1's request item for this query."""
        return {"action_type": self.fn, "dataset_name": dataset_name, "sample_id": sample_id,
                "entity_id": self.args[0], "relation": self.args[1] if len(self.args) > 1 else None}


@dataclass(frozen=True)
class QueryFormatError:
    message: str


class _Bad(Exception):
    """Internal: aborts the scan with a model-facing message."""


def parse_query(text: str) -> KGQuery | QueryFormatError:
    """Parse one query; never raises (any string gives a `KGQuery` or a `QueryFormatError`)."""
    try:
        return _parse(text)
    except _Bad as exc:
        return QueryFormatError(f"{exc} Use one of: {USAGE}.")
    except Exception as exc:  # noqa: BLE001 - a parser bug must not end a rollout; the model sees a format error
        return QueryFormatError(f"unparseable query ({type(exc).__name__}). Use one of: {USAGE}.")


def _parse(text: str) -> KGQuery:
    if not isinstance(text, str):
        raise _Bad(f"the query must be text, got {type(text).__name__}.")
    s = text.strip()
    if not s:
        raise _Bad("empty query.")
    if len(s) > MAX_QUERY_CHARS:
        raise _Bad(f"query too long ({len(s)} characters, limit {MAX_QUERY_CHARS}).")
    s = _unwrap(s)
    match = _NAME_RE.match(s)
    if match is None:
        ident = _IDENT_RE.match(s)
        fn = canonical_name(ident.group()) if ident and ident.end() == len(s) else None
        if fn:
            raise _Bad(f"{ident.group()} needs its arguments in parentheses, e.g. {OPERATIONS[fn].usage}.")
        raise _Bad("expected a function call such as get_relations_out(\"entity\").")
    called = match.group(1)
    args, end = _scan_args(s, match.end(), called)
    rest = s[end:].strip()
    if rest and rest != ";":
        raise _Bad(f"unexpected text after {called}(…): {_show(rest)}; write exactly one call per <kg-query>.")
    fn = canonical_name(called)
    if fn is None:
        close = difflib.get_close_matches(called.lower(), ALL_NAMES, n=1, cutoff=0.6)
        raise _Bad(f"unknown function {_show(called)}" + (f"; did you mean {close[0]}?" if close else "."))
    spec = OPERATIONS[fn]
    if len(args) != spec.arity:
        params = ", ".join(spec.params)
        raise _Bad(f"{called} takes {spec.arity} argument{'s' if spec.arity > 1 else ''} ({params}), got {len(args)}: "
                   f"write {spec.usage}" + ("; quote names that contain commas." if len(args) > spec.arity else "."))
    for param, value in zip(spec.params, args):
        if not value.strip():
            raise _Bad(f"the {param} argument of {called} is empty.")
        if len(value) > MAX_ARG_CHARS:
            raise _Bad(f"the {param} argument of {called} has {len(value)} characters (limit {MAX_ARG_CHARS}).")
    return KGQuery(fn, tuple(" ".join(a.split()) for a in args), called)


def _unwrap(s: str) -> str:
    """Strip quotes around a whole call, as KG-R1 does: "get_relations_out(Ada)" -> get_relations_out(Ada)."""
    close = _QUOTES.get(s[0])
    if close and len(s) > 1 and s.endswith(close):
        inner = s[1:-1].strip()
        if _NAME_RE.match(inner) and inner.endswith(")"):
            return inner
    return s


def _scan_args(s: str, i: int, called: str) -> tuple[list[str], int]:
    """Arguments from just after "(" to the matching ")"; returns them and the index after ")"."""
    args: list[str] = []
    n = len(s)
    i = _skip_space(s, i)
    if i < n and s[i] == ")":
        return args, i + 1
    while True:
        i = _skip_space(s, i)
        if i >= n:
            raise _Bad(f"missing closing parenthesis in {called}(…).")
        if s[i] in _QUOTES:
            value, i = _scan_quoted(s, i, len(args) + 1)
            i = _skip_space(s, i)
        else:
            value, i = _scan_bare(s, i, called)
        args.append(value)
        if i >= n:
            raise _Bad(f"missing closing parenthesis in {called}(…).")
        if s[i] == ")":
            return args, i + 1
        if s[i] == ",":
            i += 1
            continue
        raise _Bad(f"unexpected {_show(s[i])} after argument {len(args)} of {called}; separate arguments "
                   "with commas and put names that contain quotes or commas in double quotes.")


def _scan_quoted(s: str, i: int, position: int) -> tuple[str, int]:
    """A quoted argument starting at s[i]; backslash escapes the closing quote and itself."""
    close = _QUOTES[s[i]]
    out: list[str] = []
    j = i + 1
    n = len(s)
    while j < n:
        ch = s[j]
        if ch == "\\" and j + 1 < n and s[j + 1] in (close, "\\"):
            out.append(s[j + 1])
            j += 2
            continue
        if ch == close:
            return "".join(out), j + 1
        out.append(ch)
        j += 1
    raise _Bad(f"unterminated quote in argument {position} (opened with {s[i]}).")


def _scan_bare(s: str, i: int, called: str) -> tuple[str, int]:
    """An unquoted argument: up to a comma or ")" at bracket depth 0, so "Paris (city)" survives."""
    depth = 0
    j = i
    n = len(s)
    while j < n:
        ch = s[j]
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            break
        j += 1
    if j >= n:
        raise _Bad(f"missing closing parenthesis in {called}(…).")
    return s[i:j].strip(), j


def _skip_space(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i].isspace():
        i += 1
    return i


def _show(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
