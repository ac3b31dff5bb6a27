"""KnowRL's knowledge base: chunking as theirs, the SQLite schema, read back the way their code reads it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragrl.cli import main
from ragrl.errors import DataFormatError
from ragrl.kb.build import (
    SEPARATOR,
    build_kb,
    load_counter,
    pack_passages,
    read_document,
    split_into_sentences,
    validate_kb,
    word_counter,
)

# zjunlp/KnowRL train/reward_function/FActScore/build_knowledge/build_knowledge_base.py
THEIR_DDL = "CREATE TABLE documents (title PRIMARY KEY, text)"


def their_get_text_from_title(db: Path, title: str) -> list[dict]:
    """factscore/retrieval.py DocDB.get_text_from_title, minus its logging and lru_cache."""
    connection = sqlite3.connect(db, check_same_thread=False)
    cursor = connection.cursor()
    cursor.execute("SELECT text FROM documents WHERE title = ?", (title,))
    results = cursor.fetchall()
    connection.close()
    if not results:
        raise ValueError(f"Document with title '{title}' not found in database")
    return [{"title": title, "text": para} for para in results[0][0].split(SEPARATOR)]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_sentences_as_theirs():
    text = "Dr. Ossel built it. It opened in 1887!\n\nIs it old? Yes, e.g. the piers.  Then"
    assert split_into_sentences(text) == ["Dr. Ossel built it.", "It opened in 1887!", "Is it old?",
                                          "Yes, e.g. the piers.", "Then"]
    assert split_into_sentences(["A b.", "C d. E f."]) == ["A b.", "C d.", "E f."]


def test_packing_as_theirs():
    counter = word_counter()
    # 3 + 2 words fit in 5; the next 2 would make 7 → new passage; a 7-word sentence is cut 5 + 2.
    sentences = ["a b c.", "d e.", "f g.", "h i j k l m n."]
    assert pack_passages(sentences, counter, 5) == ["a b c. d e.", "f g.", "h i j k l", "m n."]
    assert pack_passages([], counter, 5) == []


def test_jsonl_round_trip_read_as_their_code_reads_it(tmp_path):
    src = write_jsonl(tmp_path / "wiki.jsonl", [
        {"title": "Ossel Bridge", "text": "Ossel Bridge spans the Tamm. It opened in 1887.\n\nIda Marrow designed it."},
        {"title": "Tamm River", "text": ["The Tamm is a river.", "It is 412 km long."]},
    ])
    db = tmp_path / "kb" / "knowledge_base.db"
    stats = build_kb([src], db, max_tokens=10)
    assert stats == {"documents": 2, "passages": 3, "tokenizer": "words", "max_tokens": 10}
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT sql FROM sqlite_master WHERE name = 'documents'").fetchone()[0] == THEIR_DDL
    # 5 + 4 words fit in 10, 4 more would not: the third sentence starts a new passage; 5 + 5 fit.
    assert their_get_text_from_title(db, "Ossel Bridge") == [
        {"title": "Ossel Bridge", "text": "Ossel Bridge spans the Tamm. It opened in 1887."},
        {"title": "Ossel Bridge", "text": "Ida Marrow designed it."}]
    assert [p["text"] for p in their_get_text_from_title(db, "Tamm River")] == ["The Tamm is a river. It is 412 km long."]
    assert read_document(db, "Tamm River") == ["The Tamm is a river. It is 412 km long."]
    assert read_document(db, "Nowhere") is None
    assert validate_kb(db) == {"documents": 2}


def test_world_documents_and_a_real_tokenizer(tmp_path):
    long_text = " ".join(f"Sentence number {i} of the long document mentions the Tamm river." for i in range(60))
    docs = pa.table({"id": ["kb-1", "kb-2"], "title": ["Ossel Bridge", "Long"],
                     "text": ["Ossel Bridge spans the Tamm.", long_text]})
    pq.write_table(docs, tmp_path / "documents.parquet")
    db = tmp_path / "knowledge_base.db"
    counter = load_counter("sentence-transformers/all-MiniLM-L6-v2")
    build_kb([tmp_path / "documents.parquet"], db, tokenizer=counter, max_tokens=64)
    assert read_document(db, "Ossel Bridge") == ["Ossel Bridge spans the Tamm."]
    passages = read_document(db, "Long")
    assert len(passages) > 1 and " ".join(passages) == long_text
    assert all(len(counter.encode(p)) <= 64 for p in passages)


def test_their_own_db_is_taken_as_is(tmp_path):
    theirs = tmp_path / "knowledge_base.db"
    with sqlite3.connect(theirs) as conn:
        conn.execute("DROP TABLE IF EXISTS documents;")
        conn.execute("CREATE TABLE documents (title PRIMARY KEY, text);")
        conn.executemany("INSERT OR REPLACE INTO documents VALUES (?,?)",
                         [("A", f"one{SEPARATOR}two"), ("B", "three")])
    out = tmp_path / "out" / "knowledge_base.db"
    assert build_kb([theirs], out)["documents"] == 2
    assert read_document(out, "A") == ["one", "two"]
    assert [p["text"] for p in their_get_text_from_title(out, "B")] == ["three"]


@pytest.mark.parametrize("statements, needle", [
    (["CREATE TABLE other (x)"], "no table 'documents'"),
    (["CREATE TABLE documents (title PRIMARY KEY, text)"], "is empty"),
    (["CREATE TABLE documents (title, text)", "INSERT INTO documents VALUES ('a', 'b')"], "not the primary key"),
    (["CREATE TABLE documents (title PRIMARY KEY, body)"], "lacks column"),
    (["CREATE TABLE documents (title PRIMARY KEY, text)", "INSERT INTO documents VALUES ('a', 'b')",
      "INSERT INTO documents VALUES ('c', 3)"], "row 2 \\(title 'c'\\): title and text must be text"),
])
def test_a_bad_db_is_refused(tmp_path, statements, needle):
    bad = tmp_path / "bad.db"
    with sqlite3.connect(bad) as conn:
        for sql in statements:
            conn.execute(sql)
    out = tmp_path / "out" / "knowledge_base.db"
    with pytest.raises(DataFormatError, match=needle):
        build_kb([bad], out)
    assert not out.exists()


def test_not_sqlite_is_refused(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_text("title,text\n" * 200)
    with pytest.raises(DataFormatError, match="not a readable SQLite"):
        validate_kb(bad)


@pytest.mark.parametrize("line2, needle", [
    ('{"title": "B", "text": ', ":2: invalid JSON"),
    ('{"title": "B"}', ":2: field 'text': missing"),
    ('{"title": "B", "text": 7}', ":2: field 'text': expected a string"),
    ('{"title": "A", "text": "again"}', ":2: field 'title': duplicate title 'A' \\(first at .*:1\\)"),
    ('{"title": "", "text": "x"}', ":2: field 'title': expected a non-empty string"),
    ('{"title": "B", "text": "  "}', ":2: field 'text': document 'B' has no text"),
])
def test_bad_jsonl_names_the_line_and_writes_nothing(tmp_path, line2, needle):
    src = write_jsonl(tmp_path / "docs.jsonl", [{"title": "A", "text": "Fine."}, line2])
    out = tmp_path / "kb" / "knowledge_base.db"
    with pytest.raises(ValueError, match=needle):
        build_kb([src], out)
    assert not out.exists()
    assert not (tmp_path / "kb").exists() or not any((tmp_path / "kb").iterdir())


def test_cli(tmp_path, capsys):
    src = write_jsonl(tmp_path / "docs.jsonl", [{"title": "A", "text": "Fine."}])
    out = tmp_path / "knowledge_base.db"
    assert main(["kb", "--inputs", str(src), "--out", str(out)]) == 0
    assert read_document(out, "A") == ["Fine."]
    bad = write_jsonl(tmp_path / "bad.jsonl", ['{"title": 1, "text": "x"}'])
    assert main(["kb", "--inputs", str(bad), "--out", str(tmp_path / "bad.db")]) == 2
    assert "bad.jsonl:1: field 'title'" in capsys.readouterr().err
    assert not (tmp_path / "bad.db").exists()


def test_damage_in_a_long_text_is_found_by_the_thorough_check_and_named_when_read(tmp_path):
    """The check a job runs on opening a KB walks the table's pages, not the overflow pages of a
    long text: a broken overflow chain passes it, fails the thorough check (quick_check, run when
    a KB is copied), and is named with its file and document when the document is read."""
    db = tmp_path / "knowledge_base.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE documents (title PRIMARY KEY, text);")
        conn.executemany("INSERT INTO documents VALUES (?, ?)", [("Long", "word " * 4000), ("Short", "short")])
    data = bytearray(db.read_bytes())
    size = 4096  # sqlite's default page size; overflow pages are the ones that are not b-tree pages
    page = next(i for i in range(1, len(data) // size) if data[i * size] not in (2, 5, 10, 13))
    data[page * size:page * size + 4] = (999).to_bytes(4, "big")  # the chain's next page: past the end
    db.write_bytes(bytes(data))
    assert validate_kb(db) == {"documents": 2}
    with pytest.raises(DataFormatError, match=r"knowledge_base.db: damaged SQLite file \(quick_check: .*invalid page"):
        validate_kb(db, thorough=True)
    with pytest.raises(DataFormatError, match=r"knowledge_base.db: reading document 'Long' \(database disk image"):
        read_document(db, "Long")
    assert read_document(db, "Short") == ["short"]
    with pytest.raises(DataFormatError, match="damaged SQLite file"):
        build_kb([db], tmp_path / "out" / "knowledge_base.db")
