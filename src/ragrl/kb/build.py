"""Build, validate and read KnowRL's knowledge base.

The file is the one KnowRL's reward reads (`train/reward_function/FActScore/build_knowledge/
build_knowledge_base.py`, `factscore/retrieval.py` at zjunlp/KnowRL HEAD): one SQLite table
`documents (title PRIMARY KEY, text)`, where `text` is the document's passages joined with
`####SPECIAL####SEPARATOR####`. Passages are made as theirs: the text is split into paragraphs at
blank lines, paragraphs into sentences (regex on . ! ? with common abbreviations protected), and
consecutive sentences are packed into passages of at most `max_tokens` tokens (256 in KnowRL); a
sentence longer than that is cut into token windows on its own.

Differences from their builder, all on bad input (same output on clean input):
- a record without a title or text, with an empty text, or a title seen before is an error naming
  the file and line (theirs skips it silently and counts it);
- nothing is written unless every record is good (theirs commits every 10,000 documents);
- sentences are never truncated (theirs encodes with truncation at 450 tokens, which silently
  drops the rest of a longer sentence).

Inputs: the world's `kb/documents.parquet` (`title, text`), KnowRL's JSONL or JSON array of
`{title, text}` (text a string or a list of strings, as their builder accepts), or an existing
`knowledge_base.db`, validated and copied as is.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragrl.errors import DataFormatError, InputError
from ragrl.io import atomic_path

SEPARATOR = "####SPECIAL####SEPARATOR####"
MAX_TOKENS = 256
KB_FORMATS = ("parquet", "jsonl", "json", "sqlite")
# KnowRL's list, protected so "Dr. Smith" does not end a sentence.
_ABBREVIATIONS = ("Mr.", "Mrs.", "Ms.", "Dr.", "Prof.", "St.", "e.g.", "i.e.", "etc.", "vs.", "U.S.", "U.K.",
                  "B.C.", "A.D.", "Ph.D.", "M.D.", "p.m.", "a.m.")
_DOT = "[DOT]"
_PARAGRAPH = re.compile(r"\n\n+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_into_sentences(text: str | Sequence[str]) -> list[str]:
    """KnowRL's `split_into_sentences`: paragraphs at blank lines, then sentences; a list of texts
    is split item by item."""
    if not isinstance(text, str):
        return [s for item in text for s in split_into_sentences(item)]
    for abbr in _ABBREVIATIONS:
        text = text.replace(abbr, abbr.replace(".", _DOT))
    sentences = []
    for paragraph in _PARAGRAPH.split(text):
        for sentence in _SENTENCE_END.split(paragraph):
            if sentence.strip():
                for abbr in _ABBREVIATIONS:
                    sentence = sentence.replace(abbr.replace(".", _DOT), abbr)
                sentences.append(sentence.strip())
    return sentences


@dataclass(frozen=True)
class TokenCounter:
    """What passage packing needs from a tokenizer: ids of a text, and text of a window of ids."""

    name: str
    encode: Callable[[str], list[Any]]
    decode: Callable[[list[Any]], str]


def word_counter() -> TokenCounter:
    return TokenCounter("words", str.split, " ".join)


def load_counter(name: str) -> TokenCounter:
    """`words` (whitespace tokens, no model), or a tokenizer by HF id or path (KnowRL: roberta-large)."""
    if name == "words":
        return word_counter()
    from transformers import AutoTokenizer

    from ragrl.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(name, "kb tokenizer"))
    return TokenCounter(name, lambda s: list(tok.encode(s, add_special_tokens=False)),
                        lambda ids: tok.decode(ids, skip_special_tokens=True))


def pack_passages(sentences: Sequence[str], counter: TokenCounter, max_tokens: int = MAX_TOKENS) -> list[str]:
    """KnowRL's `process_document`: whole sentences packed greedily up to `max_tokens`; an
    oversized sentence flushes the current passage and is cut into `max_tokens` windows."""
    if max_tokens < 1:
        raise InputError(f"max_tokens must be >= 1, got {max_tokens}")
    passages: list[str] = []
    current: list[str] = []
    count = 0
    for sentence in sentences:
        tokens = counter.encode(sentence)
        if current and count + len(tokens) > max_tokens:
            passages.append(" ".join(current))
            current, count = [], 0
        if len(tokens) > max_tokens:
            passages += [counter.decode(tokens[i:i + max_tokens]) for i in range(0, len(tokens), max_tokens)]
        else:
            current.append(sentence)
            count += len(tokens)
    if current:
        passages.append(" ".join(current))
    return passages


# --------------------------------------------------------------------------- reading documents


def _documents(fmt: str, path: Path) -> Iterator[tuple[str, str, str | list[str]]]:
    """(where, title, text) per document, every record checked."""
    from ragrl.corpus.readers import iter_json_array, iter_jsonl, json_kind

    if fmt == "parquet":
        from ragrl.io import read_columns

        table = read_columns(path, ["title", "text"]).to_pydict()
        for i, (title, text) in enumerate(zip(table["title"], table["text"])):
            yield f"{path}: record {i}", title, text
        return
    records = iter_jsonl(path) if fmt == "jsonl" else iter_json_array(path)
    for at, record in records:
        for key in ("title", "text"):
            if key not in record:
                raise at.error("missing", key)
        text = record["text"]
        if isinstance(text, list) and not all(isinstance(t, str) for t in text):
            raise at.error("expected a string or a list of strings", "text")
        if not isinstance(text, (str, list)):
            raise at.error(f"expected a string or a list of strings, got {json_kind(text)}", "text")
        yield str(at), record["title"], text


def _checked(where: str, title: Any, text: Any, seen: dict[str, str]) -> str:
    if not isinstance(title, str) or not title.strip():
        raise InputError(f"{where}: field 'title': expected a non-empty string, got {title!r}")
    if title in seen:
        raise InputError(f"{where}: field 'title': duplicate title {title!r} (first at {seen[title]})")
    body = text if isinstance(text, str) else " ".join(text or [])
    if not isinstance(body, str) or not body.strip():
        raise InputError(f"{where}: field 'text': document {title!r} has no text")
    seen[title] = where
    return title


def kb_format(path: str | os.PathLike, fmt: str | None = None) -> str:
    """The input's format: given, or from its suffix (.parquet, .jsonl, .json, .db/.sqlite)."""
    if fmt:
        if fmt not in KB_FORMATS:
            raise InputError(f"unknown KB input format {fmt!r}; expected one of {KB_FORMATS}")
        return fmt
    suffix = Path(path).suffix.lower()
    by_suffix = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "json", ".db": "sqlite", ".sqlite": "sqlite"}
    if suffix not in by_suffix:
        raise InputError(f"{path}: cannot tell the KB input format from the suffix {suffix!r}; give one of {KB_FORMATS}")
    return by_suffix[suffix]


# --------------------------------------------------------------------------- building


def build_kb(inputs: Sequence[str | os.PathLike], out: str | os.PathLike, *, fmt: str | None = None,
             tokenizer: str | TokenCounter = "words", max_tokens: int = MAX_TOKENS) -> dict:
    """Write the KB at `out` from document files (or copy one validated KB); nothing is written
    unless every input is good. `tokenizer`: what passage lengths are counted in (`words`, or a
    tokenizer by HF id / path, loaded only when documents are chunked). Returns counts."""
    if not inputs:
        raise InputError("no KB inputs given")
    formats = {kb_format(p, fmt) for p in inputs}
    if "sqlite" in formats:
        if len(inputs) != 1:
            raise InputError(f"an existing KB is taken as is, alone; got {len(inputs)} inputs: {list(map(str, inputs))}")
        stats = validate_kb(inputs[0], thorough=True)  # the copy reads every page anyway
        with atomic_path(out) as tmp:
            _copy_db(Path(inputs[0]), tmp)
        return {**stats, "source": "sqlite"}
    for p in inputs:
        if not Path(p).exists():
            raise FileNotFoundError(f"KB input {p}: no such file")
    counter = tokenizer if isinstance(tokenizer, TokenCounter) else load_counter(tokenizer)
    rows: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    passages = 0
    from ragrl.progress import progress

    for path in inputs:
        docs = list(_documents(kb_format(path, fmt), Path(path)))
        for where, title, text in progress(docs, f"kb {Path(path).name}", unit="doc"):
            _checked(where, title, text, seen)
            chunks = pack_passages(split_into_sentences(text), counter, max_tokens)
            passages += len(chunks)
            rows.append((title, SEPARATOR.join(chunks)))
    if not rows:
        raise DataFormatError(inputs[0], "no documents")
    with atomic_path(out) as tmp:
        with _connect(tmp) as conn:
            # KnowRL's DDL, verbatim: their reader and ours both query it by title.
            conn.execute("CREATE TABLE documents (title PRIMARY KEY, text);")
            conn.executemany("INSERT INTO documents VALUES (?, ?)", rows)
    return {"documents": len(rows), "passages": passages, "tokenizer": counter.name, "max_tokens": max_tokens}


class _connect:
    """A connection that commits and closes (sqlite3's own context manager only commits)."""

    def __init__(self, path: str | os.PathLike, readonly: bool = False) -> None:
        uri = f"file:{Path(path).resolve()}?mode=ro" if readonly else str(path)
        self.conn = sqlite3.connect(uri, uri=readonly)

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, exc_type, *_: Any) -> None:
        if exc_type is None:
            self.conn.commit()
        self.conn.close()


def _copy_db(src: Path, dst: Path) -> None:
    # The backup API copies a consistent snapshot even of a database in WAL mode.
    with _connect(src, readonly=True) as source, _connect(dst) as target:
        source.backup(target)


# --------------------------------------------------------------------------- validating and reading


def validate_kb(path: str | os.PathLike, thorough: bool = False) -> dict:
    """Check that `path` is a KB KnowRL's reader can use: a `documents` table with a `title`
    primary key and a `text` column, at least one document, text strings. Returns counts.

    Every job that opens a KB calls this first (`ragrl factscore`, KnowRL's reward and
    evaluation), so it must stay quick on a multi-GB file. SQLite refuses on open a file shorter
    than its header says (a truncated copy), and the COUNT(*) (the title index) and the type scan
    below walk every b-tree page of the table, though not the overflow pages that hold long
    texts. `PRAGMA quick_check` reads those too: on a 400 MB KB of 100k documents (warm cache)
    0.29 s against 0.15 s for the scan, and cold it reads the whole file from disk. So it runs
    only when `thorough` (copying a KB, which reads every page anyway); damage in a text the scan
    does not reach is named by `read_document` when that document is read."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"knowledge base {path}: no such file")
    with _reading(path, "not a readable SQLite database"), _connect(path, readonly=True) as conn:
        columns = {row[1]: row for row in conn.execute("PRAGMA table_info(documents)")}
        if not columns:
            raise DataFormatError(path, "no table 'documents' (KnowRL's schema: documents(title PRIMARY KEY, text))")
        missing = [c for c in ("title", "text") if c not in columns]
        if missing:
            raise DataFormatError(path, f"table 'documents' lacks column(s) {missing}; it has {sorted(columns)}")
        if not columns["title"][5]:
            raise DataFormatError(path, "table 'documents': 'title' is not the primary key")
        count = conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
        if count == 0:
            raise DataFormatError(path, "table 'documents' is empty")
        bad = conn.execute("SELECT rowid, title FROM documents WHERE typeof(title) != 'text' "
                           "OR typeof(text) != 'text' LIMIT 1").fetchone()
        if bad is not None:
            raise DataFormatError(path, f"table 'documents' row {bad[0]} (title {bad[1]!r}): title and text "
                                        "must be text")
        if thorough:
            found = "\n".join(r[0] for r in conn.execute("PRAGMA quick_check(5)"))
            if found != "ok":
                problems = [line for line in found.splitlines() if line and not line.startswith("***")]
                raise DataFormatError(path, f"damaged SQLite file (quick_check: {'; '.join(problems)[:500]})")
    return {"documents": count}


@contextmanager
def _reading(path: str | os.PathLike, what: str) -> Iterator[None]:
    """sqlite's errors on `path` as a DataFormatError naming the file ("database disk image is
    malformed" alone names nothing)."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        raise DataFormatError(path, f"{what} ({exc})") from None


def read_document(path: str | os.PathLike, title: str) -> list[str] | None:
    """The passages of document `title`, read as KnowRL's DocDB does; None when there is none."""
    with _reading(path, f"reading document {title!r}"), _connect(path, readonly=True) as conn:
        row = conn.execute("SELECT text FROM documents WHERE title = ?", (title,)).fetchone()
    return None if row is None else row[0].split(SEPARATOR)


def kb_titles(path: str | os.PathLike) -> list[str]:
    with _reading(path, "reading the titles"), _connect(path, readonly=True) as conn:
        return [r[0] for r in conn.execute("SELECT title FROM documents ORDER BY title")]
