"""Readers for public passage-corpus formats, all producing the one passages contract.

Contract (parquet): `id, title, text, source`, all strings; the text a model sees is
"{title}\\n{text}". Formats:

- `kilt`: KILT knowledge source jsonl, one Wikipedia page a line, cut into word windows.
- `dpr`: DPR / wiki-18 tsv (`id\\ttext\\ttitle`), one passage per line; a field wrapped in
  quotes with inner quotes doubled (how DPR's csv writer quotes) is unquoted, any other quote is
  text. A quote never spans lines: with csv quoting, one stray quote silently merged every row up
  to the next quote into one passage.
- `flashrag`: FlashRAG / Search-R1 jsonl, `{"id", "contents": "\\"Title\\"\\ntext"}`; the title
  line is kept as written, quotes included (`strip_title_quotes` to remove them).
- `hotpotqa`, `2wikimultihopqa`, `musique`: the paragraphs shipped with those QA sets. They have
  no passage ids, so ids are derived from content: the same paragraph, in any question or split,
  gets the same id, which is what lets QA supporting ids join the corpus.

Inputs are streamed; any malformed record raises DataFormatError naming file, line (or record
index) and field, and `write_passages` then leaves no output behind. Plain `.gz` inputs are read
transparently since that is how DPR and Search-R1 distribute their corpora.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragrl.corpus.chunking import DEFAULT_WORDS, check_window, word_windows
from ragrl.errors import DataFormatError, InputError
from ragrl.io import atomic_path

PASSAGE_SCHEMA = pa.schema(
    [("id", pa.string()), ("title", pa.string()), ("text", pa.string()), ("source", pa.string())]
)
CORPUS_FORMATS = ("parquet", "kilt", "dpr", "flashrag", "hotpotqa", "2wikimultihopqa", "musique")
# Formats whose ids are content hashes: a repeated id is the same paragraph, so it is merged
# rather than reported.
CONTENT_ADDRESSED = frozenset({"hotpotqa", "2wikimultihopqa", "musique"})

PathLike = str | os.PathLike


# --------------------------------------------------------------------------- locations and fields


@dataclass(frozen=True, slots=True)
class Where:
    """A record's place in its file: a 1-based line, or a 0-based index in a JSON array."""

    path: str
    line: int | None = None
    record: int | None = None

    def error(self, message: str, field: str | None = None) -> DataFormatError:
        return DataFormatError(self.path, message, line=self.line, field=field, record=self.record)

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.path}:{self.line}"
        if self.record is not None:
            return f"{self.path}: record {self.record}"
        return self.path


def json_kind(value: Any) -> str:
    """The JSON name of a value's type, for messages read by people who wrote JSON, not Python."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def get_field(obj: dict, key: str, at: Where, field: str | None = None) -> Any:
    if key not in obj:
        raise at.error("missing", field or key)
    return obj[key]


def get_str(obj: dict, key: str, at: Where, *, field: str | None = None, nonblank: bool = False) -> str:
    field = field or key
    value = get_field(obj, key, at, field)
    if not isinstance(value, str):
        raise at.error(f"expected a string, got {json_kind(value)}", field)
    if nonblank and not value.strip():
        raise at.error("must not be empty", field)
    return value


def get_id(obj: dict, key: str, at: Where, *, field: str | None = None) -> str:
    """Ids are strings in the contract; some public files store them as integers."""
    field = field or key
    value = get_field(obj, key, at, field)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise at.error(f"expected a string or integer id, got {json_kind(value)}", field)
    value = str(value)
    if not value.strip():
        raise at.error("must not be empty", field)
    return value


def get_list(obj: dict, key: str, at: Where, *, field: str | None = None, nonempty: bool = False) -> list:
    field = field or key
    value = get_field(obj, key, at, field)
    if not isinstance(value, list):
        raise at.error(f"expected an array, got {json_kind(value)}", field)
    if nonempty and not value:
        raise at.error("must not be empty", field)
    return value


def get_str_list(
    obj: dict, key: str, at: Where, *, field: str | None = None, nonempty: bool = False
) -> list[str]:
    field = field or key
    value = get_list(obj, key, at, field=field, nonempty=nonempty)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise at.error(f"expected a string, got {json_kind(item)}", f"{field}[{i}]")
    return value


# --------------------------------------------------------------------------- file-level parsing


def _open_binary(path: PathLike):
    return gzip.open(path, "rb") if Path(path).suffix == ".gz" else open(path, "rb")


def text_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line with its newline), so a bad byte is reported by line."""
    with _open_binary(path) as handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFormatError(path, f"not valid UTF-8 ({exc.reason})", line=lineno) from None
            yield lineno, text


def iter_jsonl(path: PathLike) -> Iterator[tuple[Where, dict]]:
    """JSON objects one per line; blank lines (a trailing newline, say) are not records."""
    name = str(path)
    seen_any = False
    for lineno, text in text_lines(path):
        if not text.strip():
            continue
        at = Where(name, line=lineno)
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise at.error(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(record, dict):
            raise at.error(f"expected a JSON object, got {json_kind(record)}")
        seen_any = True
        yield at, record
    if not seen_any:
        raise DataFormatError(path, "empty file: no records")


def iter_json_array(path: PathLike) -> Iterator[tuple[Where, dict]]:
    """Records of a file holding one JSON array (HotpotQA style).

    Read whole: these files are at most a few hundred MB, and streaming a JSON array would need a
    dependency. Records are located by array index since they usually share a single line.
    """
    name = str(path)
    with _open_binary(path) as handle:
        raw = handle.read()
    if not raw.strip():
        raise DataFormatError(path, "empty file: no records")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, f"not valid UTF-8 ({exc.reason})") from None
    if not isinstance(data, list):
        raise DataFormatError(path, f"expected a JSON array of records, got {json_kind(data)}")
    if not data:
        raise DataFormatError(path, "empty file: no records")
    for index, record in enumerate(data):
        at = Where(name, record=index)
        if not isinstance(record, dict):
            raise at.error(f"expected a JSON object, got {json_kind(record)}")
        yield at, record


# --------------------------------------------------------------------------- per-format parsing

Passage = dict[str, str]
Located = Iterator[tuple[Where, Passage]]


def content_id(prefix: str, title: str, text: str) -> str:
    """Stable id for a paragraph that has none: same title and text, same id, in every file."""
    digest = hashlib.sha1(f"{title}\n{text}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"{prefix}-{digest[:16]}"


_BULLET = re.compile(r"^BULLET::::-?\s*")


def kilt_body(title: str, paragraphs: list[str]) -> list[str]:
    """The passage text of a KILT page.

    KILT repeats the title as paragraph 0 and turns headings into "Section::::A:::: B."
    paragraphs; KILT's own DPR-style split drops both. List items keep their text but lose the
    "BULLET::::- " markup, which would otherwise be shown to models as words.
    """
    if paragraphs and paragraphs[0].strip() == title.strip():
        paragraphs = paragraphs[1:]
    return [_BULLET.sub("", p.strip()) for p in paragraphs if not p.lstrip().startswith("Section::::")]


def _kilt(path: PathLike, words: int) -> Located:
    for at, page in iter_jsonl(path):
        page_id = get_id(page, "wikipedia_id", at)
        title = get_str(page, "wikipedia_title", at)
        # A page has at least its title paragraph; an empty list means a broken export. A page
        # whose body is only headings is legitimate and simply yields no passages.
        paragraphs = get_str_list(page, "text", at, nonempty=True)
        for k, text in enumerate(word_windows(kilt_body(title, paragraphs), words)):
            yield at, {"id": f"{page_id}-{k}", "title": title, "text": text}


_DPR_HEADER = ["id", "text", "title"]


def _dpr(path: PathLike, words: int) -> Located:
    name = str(path)
    header_seen = rows_seen = False
    for lineno, raw in text_lines(path):
        line = raw.rstrip("\n").removesuffix("\r")
        if not line.strip():
            continue
        at = Where(name, line=lineno)
        row = [_tsv_unquote(field) for field in line.split("\t")]
        if not header_seen:
            if row != _DPR_HEADER:
                raise at.error(f"expected the header 'id<TAB>text<TAB>title', got {row!r:.80}")
            header_seen = True
            continue
        if len(row) != 3:
            raise at.error(f"expected 3 tab-separated columns (id, text, title), got {len(row)}")
        passage_id, text, title = row
        if not passage_id.strip():
            raise at.error("must not be empty", "id")
        if not text.strip():
            raise at.error("must not be empty", "text")
        rows_seen = True
        yield at, {"id": passage_id, "title": title, "text": text}
    if not rows_seen:
        raise DataFormatError(path, "empty file: no passages" + (" after the header" if header_seen else ""))


def _tsv_unquote(field: str) -> str:
    """A csv-quoted field ("a ""b"" c") → a "b" c; anything else, stray quotes included, as is."""
    if len(field) >= 2 and field[0] == field[-1] == '"':
        inner = field[1:-1]
        if '"' not in inner.replace('""', ""):
            return inner.replace('""', '"')
    return field


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG `contents` → (title, text): the first line is the title, kept as the corpus has it.

    wiki-18 writes titles in quotes (`"Kessa Bay"`), and Search-R1 shows them to the model that
    way (`Doc 1(Title: "Kessa Bay") ...`), so the quotes are part of the title unless the reader
    is told to strip them (`strip_title_quotes`).
    """
    title, _, text = contents.partition("\n")
    return title, text


def unquote_title(title: str) -> str:
    """`"Kessa Bay"` → `Kessa Bay`: only one outer pair of double quotes is removed."""
    return title[1:-1] if len(title) >= 2 and title[0] == title[-1] == '"' else title


def format_contents(title: str, text: str) -> str:
    """Inverse of `split_contents`: the title line as is, then the text."""
    if "\n" in title:
        raise InputError(f"a title cannot contain a newline in the flashrag format: {title!r}")
    return f"{title}\n{text}"


def _flashrag(path: PathLike, words: int) -> Located:
    for at, record in iter_jsonl(path):
        passage_id = get_id(record, "id", at)
        title, text = split_contents(get_str(record, "contents", at))
        if not text.strip():
            raise at.error('expected "title\\ntext" with a non-empty text after the title line', "contents")
        yield at, {"id": passage_id, "title": title, "text": text}


def join_sentences(sentences: Iterable[str]) -> str:
    """One paragraph from sentence strings.

    HotpotQA keeps the separating space at the start of each sentence; 2WikiMultihopQA strips it.
    A space is added only where neither side has one, so both rebuild the original paragraph.
    """
    out = ""
    for sentence in sentences:
        if out and not out[-1].isspace() and not sentence[:1].isspace():
            out += " "
        out += sentence
    return out.strip()


def hotpot_paragraphs(record: dict, at: Where, prefix: str) -> list[Passage]:
    """Passages of one HotpotQA-style record's `context`: [[title, [sentence, ...]], ...]."""
    out = []
    for j, item in enumerate(get_list(record, "context", at, nonempty=True)):
        field = f"context[{j}]"
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], list)
            and all(isinstance(s, str) for s in item[1])
        ):
            raise at.error("expected [title, [sentence, ...]]", field)
        title, text = item[0], join_sentences(item[1])
        if not text:
            raise at.error("paragraph text must not be empty", field)
        out.append({"id": content_id(prefix, title, text), "title": title, "text": text})
    return out


def _hotpot_like(prefix: str) -> Callable[[PathLike, int], Located]:
    def read(path: PathLike, words: int) -> Located:
        for at, record in iter_json_array(path):
            for passage in hotpot_paragraphs(record, at, prefix):
                yield at, passage

    return read


def musique_paragraphs(record: dict, at: Where) -> list[tuple[Passage, dict]]:
    """(passage, raw paragraph object) for each of a MuSiQue record's `paragraphs`."""
    out = []
    for j, raw in enumerate(get_list(record, "paragraphs", at, nonempty=True)):
        field = f"paragraphs[{j}]"
        if not isinstance(raw, dict):
            raise at.error(f"expected an object, got {json_kind(raw)}", field)
        title = get_str(raw, "title", at, field=f"{field}.title")
        text = get_str(raw, "paragraph_text", at, field=f"{field}.paragraph_text", nonblank=True).strip()
        out.append(({"id": content_id("musique", title, text), "title": title, "text": text}, raw))
    return out


def _musique(path: PathLike, words: int) -> Located:
    for at, record in iter_jsonl(path):
        for passage, _ in musique_paragraphs(record, at):
            yield at, passage


def _parquet(path: PathLike, words: int) -> Located:
    # Passages already in the contract (the synthetic world, or a corpus prepared elsewhere):
    # validated row by row like any other format, so a bad file fails here, not in the index.
    table_file = pq.ParquetFile(path)
    missing = {"id", "title", "text"} - set(table_file.schema_arrow.names)
    if missing:
        raise DataFormatError(str(path), f"missing column(s) {sorted(missing)}; expected id, title, text")
    index = 0
    for batch in table_file.iter_batches(columns=["id", "title", "text"], batch_size=10_000):
        for row in batch.to_pylist():
            at = Where(str(path), record=index)
            index += 1
            for field in ("id", "title", "text"):
                if not isinstance(row[field], str):
                    raise at.error(f"expected a string, got {json_kind(row[field])}", field)
            if not row["text"].strip():
                raise at.error("text must not be empty", "text")
            yield at, {"id": row["id"], "title": row["title"], "text": row["text"]}


_LOCATED: dict[str, Callable[[PathLike, int], Located]] = {
    "parquet": _parquet,
    "kilt": _kilt,
    "dpr": _dpr,
    "flashrag": _flashrag,
    "hotpotqa": _hotpot_like("hotpotqa"),
    "2wikimultihopqa": _hotpot_like("2wikimultihopqa"),
    "musique": _musique,
}


def _located(fmt: str) -> Callable[[PathLike, int], Located]:
    try:
        return _LOCATED[fmt]
    except KeyError:
        raise InputError(f"unknown corpus format {fmt!r}; expected one of {', '.join(CORPUS_FORMATS)}") from None


def _unquoted_titles(located: Iterable[tuple]) -> Iterator[tuple]:
    """Located items (tuples ending in a passage) with `unquote_title` applied to each title."""
    for item in located:
        item[-1]["title"] = unquote_title(item[-1]["title"])
        yield item


def _first_occurrences(located: Iterable[tuple]) -> Iterator[tuple]:
    """Keep the first of located items (tuples ending in a passage) sharing a passage id."""
    seen: set[str] = set()
    for item in located:
        passage_id = item[-1]["id"]
        if passage_id not in seen:
            seen.add(passage_id)
            yield item


# --------------------------------------------------------------------------- public reading API


def read_passages(
    fmt: str, path: PathLike, *, words: int = DEFAULT_WORDS, source: str | None = None,
    strip_title_quotes: bool = False,
) -> Iterator[Passage]:
    """Passage dicts (`id, title, text, source`) from one file in format `fmt`.

    `words` is the window size for `kilt` (ignored by formats that come already split). `source`
    defaults to the format name. Content-addressed formats yield each paragraph once. Titles are
    kept as the corpus writes them; `strip_title_quotes` removes one outer pair of double quotes.
    """
    # Validated here rather than inside a generator, so a typo fails at the call, not at the
    # first iteration somewhere downstream.
    reader = _located(fmt)
    check_window(words)
    located = reader(path, words)
    if strip_title_quotes:
        located = _unquoted_titles(located)
    if fmt in CONTENT_ADDRESSED:
        located = _first_occurrences(located)
    return _labelled(located, fmt if source is None else source)


def _labelled(located: Iterable[tuple[Where, Passage]], source: str) -> Iterator[Passage]:
    for _, passage in located:
        passage["source"] = source
        yield passage


def read_kilt(path: PathLike, words: int = DEFAULT_WORDS) -> Iterator[Passage]:
    return read_passages("kilt", path, words=words)


def read_dpr(path: PathLike) -> Iterator[Passage]:
    return read_passages("dpr", path)


def read_flashrag(path: PathLike) -> Iterator[Passage]:
    return read_passages("flashrag", path)


def read_hotpotqa(path: PathLike) -> Iterator[Passage]:
    return read_passages("hotpotqa", path)


def read_2wikimultihopqa(path: PathLike) -> Iterator[Passage]:
    return read_passages("2wikimultihopqa", path)


def read_musique(path: PathLike) -> Iterator[Passage]:
    return read_passages("musique", path)


# --------------------------------------------------------------------------- writing


class _IdLedger:
    """Every id written so far with its input and line, kept as Arrow arrays.

    wiki-18 has 21M passages: a Python dict of ids and locations would take several GB, the
    columnar copy a fraction, and locations are only turned into text for the error message.
    """

    def __init__(self) -> None:
        self._ids: list[pa.Array] = []
        self._inputs: list[pa.Array] = []
        self._lines: list[pa.Array] = []

    def add(self, ids: pa.Array, inputs: list[int], lines: list[int | None]) -> None:
        self._ids.append(ids)
        self._inputs.append(pa.array(inputs, pa.int32()))
        self._lines.append(pa.array(lines, pa.int64()))

    def first_duplicate(self) -> tuple[str, tuple[int, int | None], tuple[int, int | None]] | None:
        ids = pa.chunked_array(self._ids, pa.string())
        if len(ids) == 0 or pc.count_distinct(ids).as_py() == len(ids):
            return None
        counts = pc.value_counts(ids)
        duplicate = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
        first, second = pc.indices_nonzero(pc.equal(ids, duplicate))[:2].to_pylist()
        inputs, lines = pa.chunked_array(self._inputs), pa.chunked_array(self._lines)
        return (
            duplicate,
            (inputs[first].as_py(), lines[first].as_py()),
            (inputs[second].as_py(), lines[second].as_py()),
        )


def _located_inputs(formats: list[str], inputs: list[str], words: int) -> Iterator[tuple[int, Where, Passage]]:
    for index, (fmt, path) in enumerate(zip(formats, inputs, strict=True)):
        reader, count = _located(fmt), 0
        for at, passage in reader(path, words):
            count += 1
            yield index, at, passage
        if count == 0:
            raise DataFormatError(path, "no passages in file")


def input_formats(fmt: str | Sequence[str], inputs: Sequence[str]) -> list[str]:
    """One format per input: `fmt` names one for all, or one each in order (a corpus mixing
    MuSiQue's and HotpotQA's paragraphs, as AutoGraph-R1 trains on)."""
    formats = [fmt] * len(inputs) if isinstance(fmt, str) else list(fmt)
    if len(formats) != len(inputs):
        raise InputError(f"{len(formats)} formats for {len(inputs)} inputs: give one format, or one per input in order")
    for f in dict.fromkeys(formats):
        _located(f)
    return formats


def _first_content_occurrences(located: Iterable[tuple], formats: list[str]) -> Iterator[tuple]:
    """`_first_occurrences` for the inputs in content-addressed formats; others pass through (a
    repeated id there is an error the ledger reports)."""
    seen: set[str] = set()
    for item in located:
        if formats[item[0]] in CONTENT_ADDRESSED:
            if item[-1]["id"] in seen:
                continue
            seen.add(item[-1]["id"])
        yield item


class _LengthOutliers:
    """Passages far longer than the corpus's typical passage, reported as a warning in the job log.

    Corpora come pre-split into passages of similar size (100 words in wiki-18); one many times
    the median is almost always rows merged by a broken input line, which no per-row check sees.
    Lengths are kept as int32 (84 MB for wiki-18's 21M passages) and the longest few with their
    places, so the warning can name them.
    """

    FACTOR = 10  # a passage longer than FACTOR x the median length is an outlier
    MIN_CHARS = 5_000  # ... and longer than this, so that a corpus of one-line passages is not flagged
    SHOWN = 5

    def __init__(self) -> None:
        self._lengths: list[np.ndarray] = []
        self._longest: list[tuple[int, str, str]] = []  # (chars, where, id)

    def add(self, texts: pa.Array, batch: list) -> None:
        lengths = pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.int32)
        self._lengths.append(lengths)
        for k in np.argsort(lengths)[-self.SHOWN:]:
            _, at, passage = batch[k]
            self._longest.append((int(lengths[k]), str(at), passage["id"]))
        self._longest = sorted(self._longest, reverse=True)[: self.SHOWN]

    def report(self, stream=None) -> int:
        if not self._lengths:
            return 0
        lengths = np.concatenate(self._lengths)
        median = float(np.median(lengths))
        threshold = max(self.FACTOR * median, self.MIN_CHARS)
        count = int((lengths > threshold).sum())
        if count:
            shown = "; ".join(f"{where} id {pid!r} ({chars} chars)" for chars, where, pid in self._longest
                              if chars > threshold)
            print(f"[corpus] warning: {count} passage(s) longer than {threshold:.0f} characters "
                  f"(the median is {median:.0f}): {shown}. Rows merged by a stray quote or a "
                  "missing line break look like this; check those lines.",
                  file=stream if stream is not None else sys.stderr, flush=True)
        return count


def _batches(items: Iterable, size: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def write_passages(
    fmt: str | Sequence[str],
    inputs: Iterable[PathLike],
    out_path: PathLike,
    *,
    words: int = DEFAULT_WORDS,
    source: str | None = None,
    batch_rows: int = 50_000,
    strip_title_quotes: bool = False,
) -> int:
    """Read all `inputs` into one passages parquet at `out_path`; return its rows. `fmt` is one
    format for every input or one per input (`source` then defaults to each input's format).

    A repeated id is an error naming both places, except in content-addressed formats where it
    is the same paragraph seen again and is kept once. The output appears only if every input
    is valid. Rows are streamed to the file in batches, so memory does not grow with the corpus.
    """
    check_window(words)
    inputs = [str(p) for p in inputs]
    if not inputs:
        raise InputError("write_passages needs at least one input file")
    formats = input_formats(fmt, inputs)
    labels = [f if source is None else source for f in formats]
    located = _located_inputs(formats, inputs, words)
    if strip_title_quotes:
        located = _unquoted_titles(located)
    located = _first_content_occurrences(located, formats)
    ledger = None if all(f in CONTENT_ADDRESSED for f in formats) else _IdLedger()
    outliers = _LengthOutliers()
    total = 0
    with atomic_path(out_path) as tmp:
        with pq.ParquetWriter(tmp, PASSAGE_SCHEMA, compression="zstd") as writer:
            for batch in _batches(located, batch_rows):
                ids = pa.array([p["id"] for _, _, p in batch], pa.string())
                texts = pa.array([p["text"] for _, _, p in batch], pa.string())
                outliers.add(texts, batch)
                table = pa.Table.from_arrays(
                    [
                        ids,
                        pa.array([p["title"] for _, _, p in batch], pa.string()),
                        texts,
                        pa.array([labels[i] for i, _, _ in batch], pa.string()),
                    ],
                    schema=PASSAGE_SCHEMA,
                )
                writer.write_table(table)
                if ledger is not None:
                    ledger.add(ids, [i for i, _, _ in batch], [at.line for _, at, _ in batch])
                total += len(batch)
        if ledger is not None and (dup := ledger.first_duplicate()) is not None:
            passage_id, (first_input, first_line), (second_input, second_line) = dup
            first = Where(inputs[first_input], line=first_line)
            raise DataFormatError(
                inputs[second_input],
                f"duplicate passage id '{passage_id}' (first seen at {first})",
                line=second_line,
                field="id",
            )
    outliers.report()
    return total


def write_flashrag_jsonl(passages: Iterable[dict], path: PathLike) -> int:
    """Write passages in the FlashRAG / Search-R1 corpus format (what their retrievers index)."""
    count = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for passage in passages:
            record = {"id": passage["id"], "contents": format_contents(passage["title"], passage["text"])}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count
