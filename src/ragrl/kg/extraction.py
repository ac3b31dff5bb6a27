"""AutoGraph-R1's constructor turns: tolerant parsing of a JSON array of triples and its validity rules.

A constructor answers each document with `[{"subject": …, "relation": …, "object": …}, …]`. Models
wrap that in prose or code fences, drop a closing bracket, or emit single quotes, so the text goes
through `json_repair` (the library AutoGraph-R1's own interaction uses) before any rule is applied.

Validity (AutoGraph-R1, verl `RAGInteraction.generate_response`, tightened as issue #15 asks):
a turn is valid only if it parses to a non-empty list whose every item is an object with
`subject`, `relation` and `object` strings that are non-empty after trimming. The authors only
check that the three keys are present; a number or an empty string as a name would make a node
that no question can reach, so those turns are invalid here. `allow_empty=True` accepts `[]`
for a document with nothing to extract (the authors end the episode on it).

Everything here is pure and never raises, whatever the text: a bad turn is a `ParsedTurn` with
`valid=False` and an `error` that says why.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TRIPLE_KEYS = ("subject", "relation", "object")
# Bounds that keep a pathological turn cheap: json_repair is pure Python, and a 10 MB "turn" can
# only come from a runaway generation. Beyond these the turn is invalid (not truncated), so the
# policy is never rewarded for the part it happened to get right before running away.
MAX_TURN_CHARS = 200_000
MAX_TRIPLES_PER_TURN = 1_000
MAX_NAME_CHARS = 500
_SURROGATE = re.compile(r"[\ud800-\udfff]")


@dataclass(frozen=True)
class Triple:
    subject: str
    relation: str
    object: str

    def key(self) -> tuple[str, str, str]:
        """Identity for duplicate counting: case- and whitespace-insensitive."""
        return (fold(self.subject), fold(self.relation), fold(self.object))

    def text(self) -> str:
        """How a triple is embedded and shown to a judge ("s r o", as the authors embed it)."""
        return f"{self.subject} {self.relation} {self.object}"


@dataclass(frozen=True)
class ParsedTurn:
    valid: bool
    triples: tuple[Triple, ...] = ()
    error: str | None = None


def fold(text: str) -> str:
    """Unicode-normalised, case-folded, whitespace-collapsed: how names are compared."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def clean_name(value: object) -> str | None:
    """A usable name (NFC, trimmed, inner whitespace collapsed), or None when the value is not one."""
    if not isinstance(value, str):
        return None
    if _SURROGATE.search(value):
        # json_repair decodes an escaped pair ("\\ud83d\\ude00") as two surrogates: join pairs, and
        # refuse what stays lone (half an emoji), which is not UTF-8: the KG's parquet table, the
        # embedder and the results file would raise on the name.
        try:
            value = value.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            return None
    name = " ".join(unicodedata.normalize("NFC", value).split())
    return name if 0 < len(name) <= MAX_NAME_CHARS else None


def _load(text: str) -> object:
    import json_repair

    try:
        return json_repair.loads(text)
    except Exception as exc:  # noqa: BLE001  # the repairer is a black box; model text must never raise
        return exc


def parse_triples(text: object, *, allow_empty: bool = False) -> ParsedTurn:
    """One constructor turn → its triples and whether the turn is valid (see module docstring)."""
    if not isinstance(text, str):
        return ParsedTurn(False, error=f"the turn is a {type(text).__name__}, not text")
    if len(text) > MAX_TURN_CHARS:
        return ParsedTurn(False, error=f"the turn has {len(text)} characters (limit {MAX_TURN_CHARS})")
    if not text.strip():
        return ParsedTurn(False, error="the turn is empty")
    data = _load(text)
    if isinstance(data, Exception):
        return ParsedTurn(False, error=f"not JSON, even after repair: {type(data).__name__}")
    if not isinstance(data, list):
        return ParsedTurn(False, error=f"expected a JSON array of triples, got {_kind(data)}")
    if not data:
        return ParsedTurn(allow_empty, error=None if allow_empty else "the array is empty")
    if len(data) > MAX_TRIPLES_PER_TURN:
        return ParsedTurn(False, error=f"{len(data)} triples in one turn (limit {MAX_TRIPLES_PER_TURN})")
    triples = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            return ParsedTurn(False, error=f"item {i} is {_kind(item)}, not an object")
        missing = [k for k in TRIPLE_KEYS if k not in item]
        if missing:
            return ParsedTurn(False, error=f"item {i} lacks {', '.join(missing)}")
        names = [clean_name(item[k]) for k in TRIPLE_KEYS]
        bad = [k for k, n in zip(TRIPLE_KEYS, names) if n is None]
        if bad:
            return ParsedTurn(False, error=f"item {i}: {', '.join(bad)} must be a non-empty string "
                                           f"of at most {MAX_NAME_CHARS} characters (no lone surrogates)")
        triples.append(Triple(*names))  # type: ignore[arg-type]  # all three checked above
    return ParsedTurn(True, tuple(triples))


def _kind(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), f"a {type(value).__name__}")


def repetition_share(triples: Sequence[Triple]) -> float:
    """Share of triples that repeat an earlier one (by `Triple.key`): 0 for none, → 1 for one triple
    written over and over. 0 for an empty list."""
    if not triples:
        return 0.0
    return 1.0 - len({t.key() for t in triples}) / len(triples)


def unique_triples(triples: Iterable[Triple]) -> list[Triple]:
    """First occurrence of each triple, in order."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for t in triples:
        if t.key() not in seen:
            seen.add(t.key())
            out.append(t)
    return out


def triples_json(triples: Iterable[Triple]) -> str:
    """The canonical turn text for gold SFT targets: the format the parser reads back."""
    import json

    return json.dumps([{"subject": t.subject, "relation": t.relation, "object": t.object} for t in triples],
                      ensure_ascii=False)


__all__ = ["MAX_TRIPLES_PER_TURN", "MAX_TURN_CHARS", "ParsedTurn", "TRIPLE_KEYS", "Triple", "clean_name", "fold",
           "parse_triples", "repetition_share", "triples_json", "unique_triples"]
