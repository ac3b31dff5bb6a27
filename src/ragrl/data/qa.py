"""Loaders for public QA formats, all producing the one QA contract.

Contract (parquet): `id: string, question: string, golden_answers: list<string>,
supporting_ids: list<string>, metadata: string`. `metadata` is a JSON object serialised as text:
datasets carry different extras, and a struct column would differ per dataset (and parquet cannot
store an empty struct). Formats:

- `flashrag`: FlashRAG jsonl (NQ, TriviaQA, PopQA, Bamboogle, ...); supporting ids unknown → [].
- `hotpotqa`, `2wikimultihopqa`: the original JSON arrays; supporting ids are the ids the corpus
  reader gives the context paragraphs named in `supporting_facts`, so they join that corpus.
- `musique`: MuSiQue jsonl; supporting ids from paragraphs flagged `is_supporting`.
- `kgqa`: KG question answering (KG-R1): the world's `kgqa/<K>/<split>.parquet`, or jsonl in the
  "simple" KGQA shape (`question`, `answers: [{kb_id, text}]`, `entities` or `topic_entities`).
  golden_answers are the answer texts; metadata keeps the answer entities (text and kb_id, which
  the KG rewards count as one entity) and the topic entities the agent starts from.
- `simpleqa`: OpenAI's SimpleQA CSV (`metadata,problem,answer`; metadata a Python-literal dict with
  topic, answer_type, urls), ids `simpleqa-<row>` (the file has none).
- `truthfulqa`: TruthfulQA's CSV (`Type,Category,Question,Best Answer,Correct Answers,Incorrect
  Answers,Source`, answer lists joined by "; "), or the Hugging Face `truthful_qa` generation rows
  as JSONL (`type, category, question, best_answer, correct_answers, incorrect_answers, source`);
  golden_answers = the best answer, then the other correct ones; ids `truthfulqa-<row>`.
- `gpqa`: GPQA's CSV (`Question`, `Correct Answer`, `Incorrect Answer 1..3`, optional `Record ID`):
  the options shuffled per question (seeded by its Record ID) and listed under it as "(A) …";
  golden_answers = the right letter, then its text; ids `gpqa-<Record ID or row>`.
- `aime`: AIME problems as JSONL (`question`/`problem`/`Problem`, `answer`/`Answer`); golden_answers
  the answer as written and without leading zeros; ids `aime-<id or row>`.
- `chinese_simpleqa`: Chinese SimpleQA JSONL (`question`, `answer`, `id`, categories in metadata).
- `knowrl`: KnowRL's RL data (data/rl/knowrl_RLdata.json): a JSON array of `{question, answers,
  title}`, `answers` one string, `title` the KB titles of the question joined by ';' (kept in
  metadata, where the KnowRL method finds its topic); ids `knowrl-<index>`.

A dataset may list several files, each with its format (MuSiQue + HotpotQA, as AutoGraph-R1
trains on): `load_qa` mixes them into one table.
"""

from __future__ import annotations

import ast
import csv
import json
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from ragrl.corpus.readers import (
    PathLike,
    Where,
    get_field,
    get_id,
    get_list,
    get_str,
    get_str_list,
    hotpot_paragraphs,
    iter_json_array,
    iter_jsonl,
    json_kind,
    musique_paragraphs,
)
from ragrl.errors import DataFormatError, InputError
from ragrl.io import read_columns, write_parquet

QA_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("question", pa.string()),
        ("golden_answers", pa.list_(pa.string())),
        ("supporting_ids", pa.list_(pa.string())),
        ("metadata", pa.string()),
    ]
)

Row = dict
Located = Iterator[tuple[Where, Row]]


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _answers(values: list[str], at: Where, field: str) -> list[str]:
    # An empty gold answer would make an empty prediction count as exact match.
    for i, value in enumerate(values):
        if not value.strip():
            raise at.error("answers must not be empty", f"{field}[{i}]")
    return _unique(values)


def _row(qid: str, question: str, answers: list[str], supporting: list[str], metadata: dict) -> Row:
    return {
        "id": qid,
        "question": question,
        "golden_answers": answers,
        "supporting_ids": supporting,
        "metadata": json.dumps(metadata, ensure_ascii=False, sort_keys=True),
    }


def _flashrag(path: PathLike) -> Located:
    for at, record in iter_jsonl(path):
        qid = get_id(record, "id", at)
        question = get_str(record, "question", at, nonblank=True)
        answers = _answers(get_str_list(record, "golden_answers", at, nonempty=True), at, "golden_answers")
        metadata = record.get("metadata")
        if metadata is None:
            metadata = {}
        elif not isinstance(metadata, dict):
            raise at.error(f"expected an object, got {json_kind(metadata)}", "metadata")
        yield at, _row(qid, question, answers, [], metadata)


def _supporting_facts(record: dict, at: Where) -> list[list]:
    facts = get_list(record, "supporting_facts", at)
    for i, fact in enumerate(facts):
        if not (
            isinstance(fact, list)
            and len(fact) == 2
            and isinstance(fact[0], str)
            and isinstance(fact[1], int)
            and not isinstance(fact[1], bool)
        ):
            raise at.error("expected [title, sentence index]", f"supporting_facts[{i}]")
    return facts


def _hotpot_like(prefix: str) -> Callable[[PathLike], Located]:
    def load(path: PathLike) -> Located:
        for at, record in iter_json_array(path):
            qid = get_id(record, "_id", at)
            question = get_str(record, "question", at, nonblank=True)
            answer = get_str(record, "answer", at, nonblank=True)
            facts = _supporting_facts(record, at)
            titles = {title for title, _ in facts}
            # Titles missing from the context are skipped, not errors: in the fullwiki files the
            # context is retrieved paragraphs, which need not contain the gold ones.
            supporting = _unique(p["id"] for p in hotpot_paragraphs(record, at, prefix) if p["title"] in titles)
            metadata = {key: record[key] for key in ("type", "level", "evidences") if key in record}
            metadata["supporting_facts"] = facts
            yield at, _row(qid, question, [answer], supporting, metadata)

    return load


def _musique(path: PathLike) -> Located:
    for at, record in iter_jsonl(path):
        qid = get_id(record, "id", at)
        question = get_str(record, "question", at, nonblank=True)
        answer = get_str(record, "answer", at, nonblank=True)
        aliases = _answers(get_str_list(record, "answer_aliases", at), at, "answer_aliases")
        answers = _unique([answer, *aliases])
        supporting = []
        for j, (passage, raw) in enumerate(musique_paragraphs(record, at)):
            field = f"paragraphs[{j}].is_supporting"
            flag = get_field(raw, "is_supporting", at, field)
            if not isinstance(flag, bool):
                raise at.error(f"expected a boolean, got {json_kind(flag)}", field)
            if flag:
                supporting.append(passage["id"])
        metadata = {}
        if "answerable" in record:
            if not isinstance(record["answerable"], bool):
                raise at.error(f"expected a boolean, got {json_kind(record['answerable'])}", "answerable")
            metadata["answerable"] = record["answerable"]
        if "question_decomposition" in record:
            metadata["question_decomposition"] = get_list(record, "question_decomposition", at)
        yield at, _row(qid, question, answers, _unique(supporting), metadata)


def _kgqa_records(path: PathLike) -> Located:
    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq

        for i, record in enumerate(pq.read_table(path).to_pylist()):
            yield Where(str(path), record=i), record
    else:
        yield from iter_jsonl(path)


def _kgqa(path: PathLike) -> Located:
    stem = Path(str(path)).stem
    for at, record in _kgqa_records(path):
        # Without ids, the KG server's simple-format reader names questions "<file stem>-<line>";
        # the same ids here keep subgraph lookups aligned.
        qid = get_id(record, "id", at) if record.get("id") is not None else f"{stem}-{at.line or at.record}"
        question = get_str(record, "question", at, nonblank=True)
        answers = []
        for i, item in enumerate(get_list(record, "answers", at, nonempty=True)):
            if isinstance(item, str):
                item = {"text": item, "kb_id": None}
            if not isinstance(item, dict):
                raise at.error(f"expected an object {{kb_id, text}} or a string, got {json_kind(item)}", f"answers[{i}]")
            text, kb_id = item.get("text"), item.get("kb_id")
            if not (isinstance(text, str) and text.strip()) and not (isinstance(kb_id, str) and kb_id.strip()):
                raise at.error("an answer needs a non-empty text or kb_id", f"answers[{i}]")
            answers.append({"text": text if isinstance(text, str) else None,
                            "kb_id": kb_id if isinstance(kb_id, str) else None})
        key = "topic_entities" if "topic_entities" in record else "entities"
        topics = [str(t) for t in (get_list(record, key, at) if key in record else [])]
        golds = _unique(a["text"] or a["kb_id"] for a in answers)
        metadata = {"answers": answers, "topic_entities": topics}
        for extra in ("kg", "subgraph_id"):
            if record.get(extra) is not None:
                metadata[extra] = str(record[extra])
        yield at, _row(qid, question, golds, [], metadata)


def _csv_rows(path: PathLike, columns: tuple[str, ...]) -> Iterator[tuple[Where, dict]]:
    """Rows of a CSV with a header naming at least `columns`, each located by its first line."""
    from ragrl.corpus.readers import text_lines

    lines = [text for _, text in text_lines(path)]  # decodes (and reports bad UTF-8 by line) first
    reader = csv.DictReader(lines)
    header = reader.fieldnames or []
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataFormatError(path, f"missing column(s) {missing}; the header has {header}", line=1)
    start = 2
    try:
        for row in reader:
            at = Where(str(path), line=start)
            start = reader.line_num + 1
            if None in row or any(row.get(c) is None for c in columns):
                raise at.error(f"expected {len(header)} fields as in the header")
            yield at, row
    except csv.Error as exc:
        raise DataFormatError(path, f"invalid CSV: {exc}", line=reader.line_num) from None


def _simpleqa(path: PathLike) -> Located:
    for i, (at, row) in enumerate(_csv_rows(path, ("metadata", "problem", "answer"))):
        question = row["problem"].strip()
        answer = row["answer"].strip()
        if not question:
            raise at.error("must not be empty", "problem")
        if not answer:
            raise at.error("must not be empty", "answer")
        try:
            # SimpleQA writes metadata as a Python dict literal ('single quotes'): read as a literal.
            metadata = ast.literal_eval(row["metadata"]) if row["metadata"].strip() else {}
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):  # e.g. {[1]: 2}, deep nesting
            raise at.error("not a dict literal", "metadata") from None
        if not isinstance(metadata, dict):
            raise at.error(f"expected a dict, got {type(metadata).__name__}", "metadata")
        yield at, _row(f"simpleqa-{i}", question, [answer], [], metadata)


_TRUTHFULQA_CSV = ("Type", "Category", "Question", "Best Answer", "Correct Answers", "Incorrect Answers", "Source")


def _split_answers(text: str) -> list[str]:
    return [a.strip() for a in text.split(";") if a.strip()]


def _truthfulqa(path: PathLike) -> Located:
    if str(path).endswith(".csv"):
        records = ((at, {"type": r["Type"], "category": r["Category"], "question": r["Question"],
                         "best_answer": r["Best Answer"], "correct_answers": _split_answers(r["Correct Answers"]),
                         "incorrect_answers": _split_answers(r["Incorrect Answers"]), "source": r["Source"]})
                   for at, r in _csv_rows(path, _TRUTHFULQA_CSV))
    else:
        records = iter_jsonl(path)
    for i, (at, record) in enumerate(records):
        question = get_str(record, "question", at, nonblank=True)
        best = get_str(record, "best_answer", at, nonblank=True)
        correct = _answers(get_str_list(record, "correct_answers", at), at, "correct_answers")
        incorrect = get_str_list(record, "incorrect_answers", at)
        metadata = {"best_answer": best, "incorrect_answers": incorrect}
        for key in ("type", "category", "source"):
            if isinstance(record.get(key), str):
                metadata[key] = record[key]
        yield at, _row(f"truthfulqa-{i}", question, _unique([best.strip(), *correct]), [], metadata)


def _knowrl(path: PathLike) -> Located:
    for i, (at, record) in enumerate(iter_json_array(path)):
        question = get_str(record, "question", at, nonblank=True)
        answer = get_str(record, "answers", at, nonblank=True)
        title = get_str(record, "title", at) if "title" in record else ""
        yield at, _row(f"knowrl-{i}", question, [answer.strip()], [], {"title": title} if title.strip() else {})


_GPQA_CSV = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
_LETTERS = "ABCD"


def _optional_id(record: dict, keys: Sequence[str], at: Where, row: int) -> str:
    """The record's id under the first of `keys` it holds (not null), checked as an id; else its row."""
    key = next((k for k in keys if record.get(k) is not None), None)
    return get_id(record, key, at) if key else str(row)


def _gpqa(path: PathLike) -> Located:
    """GPQA's CSV (gpqa_diamond.csv, gpqa_main.csv): the four options shuffled per question (seeded
    by its Record ID, so every run and reader shows the same order) and listed after the question
    as "(A) …"; golden_answers = the right option's letter, its text, and the two as listed
    ("(C) Xenon"; "C. Xenon" normalises alike). SQuAD normalisation drops the article "a", so
    "(A) Xenon" reads as the text alone: right whatever the letter, as "Xenon" is."""
    for i, (at, row) in enumerate(_csv_rows(path, _GPQA_CSV)):
        for column in _GPQA_CSV:
            if not row[column].strip():
                raise at.error("must not be empty", column)
        question, *options = (row[c].strip() for c in _GPQA_CSV)
        record = str(i)
        if "Record ID" in row:
            record = (row["Record ID"] or "").strip()
            if not record:  # it seeds the option order: a row number would change with the file's order
                raise at.error("must not be empty", "Record ID")
        order = list(range(4))
        random.Random(f"gpqa:{record}").shuffle(order)
        shown = [options[k] for k in order]
        letter = _LETTERS[order.index(0)]
        text = question + "\n" + "\n".join(f"({_LETTERS[j]}) {o}" for j, o in enumerate(shown))
        metadata = {"choices": shown, "answer_letter": letter, "record_id": record}
        if (row.get("High-level domain") or "").strip():
            metadata["domain"] = row["High-level domain"].strip()
        yield at, _row(f"gpqa-{record}", text, _unique([letter, options[0], f"({letter}) {options[0]}"]), [],
                       metadata)


def _aime(path: PathLike) -> Located:
    """AIME problems as JSONL: the problem under `question`, `problem` or `Problem`, the answer (an
    integer, 0-999) under `answer` or `Answer`, as a number or a string of digits; golden_answers =
    the answer as written and without leading zeros ("033", "33"); ids from `id` or `ID` (a
    string or an integer), else the row."""
    for i, (at, record) in enumerate(iter_jsonl(path)):
        key = next((k for k in ("question", "problem", "Problem") if k in record), None)
        if key is None:
            raise at.error("missing: the problem under 'question', 'problem' or 'Problem'")
        question = get_str(record, key, at, nonblank=True)
        answer_key = "Answer" if "Answer" in record and "answer" not in record else "answer"
        raw = record.get(answer_key)
        # a bool is an int, and "²".isdigit(): only a plain number or a string of ASCII digits
        written = raw.strip() if isinstance(raw, str) else str(raw) if type(raw) is int else ""
        if not (written.isascii() and written.isdigit()):
            raise at.error(f"expected a whole number >= 0 (AIME's answers are 0-999), got {json_kind(raw)} {raw!r:.40}",
                           answer_key)
        qid = _optional_id(record, ("id", "ID"), at, i)
        yield at, _row(f"aime-{qid}", question.strip(), _unique([written, written.lstrip("0") or "0"]), [], {})


def _chinese_simpleqa(path: PathLike) -> Located:
    """Chinese SimpleQA as JSONL (`question`, `answer`, optional `id` and the categories, kept in
    metadata); ids `chinese_simpleqa-<id or row>`."""
    for i, (at, record) in enumerate(iter_jsonl(path)):
        question = get_str(record, "question", at, nonblank=True)
        answer = get_str(record, "answer", at, nonblank=True)
        metadata = {k: record[k] for k in ("primary_category", "secondary_category") if isinstance(record.get(k), str)}
        qid = _optional_id(record, ("id",), at, i)
        yield at, _row(f"chinese_simpleqa-{qid}", question.strip(), [answer.strip()], [], metadata)


_LOADERS: dict[str, Callable[[PathLike], Located]] = {
    "flashrag": _flashrag,
    "hotpotqa": _hotpot_like("hotpotqa"),
    "2wikimultihopqa": _hotpot_like("2wikimultihopqa"),
    "musique": _musique,
    "kgqa": _kgqa,
    "simpleqa": _simpleqa,
    "truthfulqa": _truthfulqa,
    "knowrl": _knowrl,
    "gpqa": _gpqa,
    "aime": _aime,
    "chinese_simpleqa": _chinese_simpleqa,
}
QA_FORMATS = tuple(_LOADERS)


def row_metadata(row: dict) -> dict:
    """A QA-contract row's metadata as a mapping ({} when absent); metadata that is not a JSON
    object is an error naming the row and the field, not a bare JSONDecodeError from a reward."""
    meta = row.get("metadata") or "{}"
    try:
        meta = json.loads(meta) if isinstance(meta, str) else dict(meta)
    except (ValueError, TypeError, RecursionError) as exc:
        raise InputError(f"QA row {row.get('id')!r}: metadata: not a JSON object ({exc})") from None
    if not isinstance(meta, dict):
        raise InputError(f"QA row {row.get('id')!r}: metadata: expected a JSON object, got {type(meta).__name__}")
    return meta


def read_qa_rows(path: PathLike, limit: int | None = None, columns: Sequence[str] | None = None,
                 required: Sequence[str] = ()) -> list[dict]:
    """The first `limit` rows (None: all) of a QA parquet: id, question, golden_answers and the
    `required` columns, and those of `columns` the file has (None: every column). Checked before
    any work is done on them, so a job fails at once naming the file: a missing required column,
    and a row whose metadata is not a JSON object (the rewards and metrics read metadata per batch,
    hours into a training run)."""
    table = read_columns(path, ["id", "question", "golden_answers", *required],
                         optional=None if columns is None else tuple(columns))
    if limit is not None:
        table = table.slice(0, max(limit, 0))
    rows = table.to_pylist()
    for row in rows:
        try:
            row_metadata(row)
        except InputError as exc:
            raise InputError(f"{path}: {exc}") from None
    return rows


def row_golds(row: dict) -> list[dict[str, str] | str]:
    """Gold answers of a QA-contract row: the KGQA entities ({text, kb_id}) kept in its metadata
    by the `kgqa` loader, else its plain golden_answers."""
    answers = row_metadata(row).get("answers")
    if isinstance(answers, list) and answers:
        return [a for a in answers if isinstance(a, (dict, str))]
    return [str(g) for g in row.get("golden_answers") or []]


def load_qa(fmt: str | Sequence[str], path: PathLike | Sequence[PathLike], *, seed: int = 0) -> pa.Table:
    """A QA table (QA_SCHEMA) from one file in format `fmt`, or from several (`fmt` and `path`
    lists in the same order); question ids must be unique across all of them.

    Several files are mixed: their questions are shuffled together with `seed` (fixed, so the
    table is reproducible), so that any prefix (a `limit`, the first training batches) draws from
    every file in proportion to its size rather than from the first file only."""
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    formats = [fmt] * len(paths) if isinstance(fmt, str) else list(fmt)
    if len(formats) != len(paths):
        raise InputError(f"{len(formats)} QA formats for {len(paths)} files: give one format, or one per file in order")
    rows: list[Row] = []
    first_seen: dict[str, Where] = {}
    for f, p in zip(formats, paths, strict=True):
        try:
            loader = _LOADERS[f]
        except KeyError:
            raise InputError(f"unknown QA format {f!r}; expected one of {', '.join(QA_FORMATS)}") from None
        n = len(rows)
        for at, row in loader(p):
            if row["id"] in first_seen:
                raise at.error(f"duplicate question id '{row['id']}' (first seen at {first_seen[row['id']]})", "id")
            first_seen[row["id"]] = at
            rows.append(row)
        if len(rows) == n:
            raise DataFormatError(p, "empty file: no questions")
    if len(paths) > 1:
        random.Random(seed).shuffle(rows)
    return pa.Table.from_pylist(rows, schema=QA_SCHEMA)


def write_qa(fmt: str | Sequence[str], path: PathLike | Sequence[PathLike], out_path: PathLike) -> int:
    """Convert one QA file, or several mixed (`load_qa`), to the QA parquet at `out_path`
    (written only if valid); return rows."""
    table = load_qa(fmt, path)
    write_parquet(table, out_path)
    return table.num_rows
