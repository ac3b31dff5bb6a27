"""Corpus readers on small fixtures in the real public formats.

Expected values are written out by hand from the fixture files, so a reader that changes what it
produces (ids especially: QA supporting ids and built indexes depend on them) fails here.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrl.corpus import (
    PASSAGE_SCHEMA,
    read_2wikimultihopqa,
    read_dpr,
    read_flashrag,
    read_hotpotqa,
    read_kilt,
    read_musique,
    read_passages,
    write_flashrag_jsonl,
    write_passages,
)
from ragrl.errors import DataFormatError

FIXTURES = Path(__file__).resolve().parents[2] / "resources" / "fixtures"
CORPUS = FIXTURES / "corpus"
QA = FIXTURES / "qa"


def by_id(passages):
    return {p["id"]: p for p in passages}


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    # atomic_path's temporary sibling must be gone too, not just the final name.
    assert not out.parent.exists() or os.listdir(out.parent) == []


# --------------------------------------------------------------------------- kilt


def test_kilt_fixture_pages_become_titled_word_windows():
    passages = list(read_kilt(CORPUS / "kilt.jsonl"))
    assert [p["id"] for p in passages] == ["4101-0", "4101-1", "4102-0", "4103-0"]
    assert all(p["source"] == "kilt" for p in passages)
    lake0, lake1, bridge, river = passages
    # Verrow Lake: 57 + 54 + 8 body words = 119, so a 100-word window and a 19-word one.
    assert lake0["title"] == lake1["title"] == "Verrow Lake"
    assert len(lake0["text"].split()) == 100
    assert lake0["text"].startswith("Verrow Lake is a cold glacial lake in the fictional Amberline Hills,")
    assert lake0["text"].endswith("The jetty burned down in a storm and")
    assert lake1["text"] == (
        "was replaced by the stone pier that still stands there today. The pier is open to walkers all year."
    )
    # Section headings dropped, bullet markup stripped, title paragraph not repeated as text.
    assert bridge == {
        "id": "4102-0",
        "title": "Ossel Bridge",
        "text": "Ossel Bridge is a stone bridge over the Tamm River. It has seven arches.",
        "source": "kilt",
    }
    assert river["text"] == "The Tamm River rises in the Amberline Hills and flows south to Kessa Bay."
    assert not any("::::" in p["text"] for p in passages)


def write_kilt_page(path: Path, n_words: int, title: str = "Long Page", page_id: str = "77") -> None:
    # Two body paragraphs, so windows must run across the paragraph boundary as in DPR.
    words = [f"w{i}" for i in range(n_words)]
    half = n_words // 2
    page = {
        "_id": page_id,
        "wikipedia_id": page_id,
        "wikipedia_title": title,
        "text": [title + "\n", " ".join(words[:half]) + "\n", "Section::::Later.\n", " ".join(words[half:]) + "\n"],
    }
    path.write_text(json.dumps(page) + "\n")


def test_kilt_250_words_make_100_100_50_with_title_on_each(tmp_path):
    path = tmp_path / "kilt.jsonl"
    write_kilt_page(path, 250)
    passages = list(read_kilt(path))
    assert [p["id"] for p in passages] == ["77-0", "77-1", "77-2"]
    assert [len(p["text"].split()) for p in passages] == [100, 100, 50]
    assert {p["title"] for p in passages} == {"Long Page"}
    assert passages[1]["text"] == " ".join(f"w{i}" for i in range(100, 200))
    assert passages[2]["text"].split()[-1] == "w249"


def test_kilt_exact_multiple_has_no_empty_tail_and_size_is_configurable(tmp_path):
    path = tmp_path / "kilt.jsonl"
    write_kilt_page(path, 200)
    assert [len(p["text"].split()) for p in read_kilt(path)] == [100, 100]
    write_kilt_page(path, 250)
    assert [len(p["text"].split()) for p in read_kilt(path, words=120)] == [120, 120, 10]
    assert [len(p["text"].split()) for p in read_passages("kilt", path, words=250)] == [250]
    with pytest.raises(ValueError, match="positive number of words"):
        list(read_kilt(path, words=0))


def test_kilt_page_with_only_headings_gives_no_passages(tmp_path):
    path = tmp_path / "kilt.jsonl"
    page = {"wikipedia_id": 5, "wikipedia_title": "Stub", "text": ["Stub\n", "Section::::See also.\n"]}
    path.write_text(json.dumps(page) + "\n")
    assert list(read_kilt(path)) == []
    out = tmp_path / "out" / "p.parquet"
    with pytest.raises(DataFormatError, match="no passages"):
        write_passages("kilt", [path], out)
    assert_nothing_written(out)


# --------------------------------------------------------------------------- dpr, flashrag


def test_dpr_fixture_unquotes_csv_fields():
    passages = list(read_dpr(CORPUS / "dpr.tsv"))
    assert [p["id"] for p in passages] == ["1", "2", "3"]
    assert passages[0] == {
        "id": "1",
        "title": "Verrow Lantern",
        "text": 'The Verrow Lantern is a brass lamp lit for the "first frost" festival in Ossel.',
        "source": "dpr",
    }
    assert passages[2]["title"] == 'Kessa Bay, "Old Harbour"'
    assert passages[2]["text"] == 'Kessa Bay is a shallow bay, and its old harbour is known as "the Basin" to sailors.'


def test_flashrag_fixture_splits_title_line_and_keeps_its_quotes():
    passages = by_id(read_flashrag(CORPUS / "flashrag.jsonl"))
    assert list(passages) == ["0", "1", "2"]
    # wiki-18's quotes stay: Search-R1 shows the model `(Title: "Verrow Lantern")`.
    assert passages["0"]["title"] == '"Verrow Lantern"'
    assert passages["0"]["text"] == "The Verrow Lantern is a brass lamp lit on the night of the first frost."
    # Only the first line is the title; later newlines belong to the text.
    assert passages["1"]["title"] == '"Kessa Bay"'
    assert passages["1"]["text"] == (
        "Kessa Bay is a shallow bay where the Tamm River meets the sea.\nIts harbour freezes in hard winters."
    )
    assert passages["2"]["title"] == '"Pell "Red" Arno"'


def test_flashrag_title_quotes_are_stripped_only_when_asked(tmp_path):
    passages = by_id(read_passages("flashrag", CORPUS / "flashrag.jsonl", strip_title_quotes=True))
    assert passages["1"]["title"] == "Kessa Bay"
    # Only the outer pair of quotes is wiki-18's wrapping.
    assert passages["2"]["title"] == 'Pell "Red" Arno'
    out = tmp_path / "p.parquet"
    write_passages("flashrag", [CORPUS / "flashrag.jsonl"], out, strip_title_quotes=True)
    assert pq.read_table(out)["title"].to_pylist() == ["Verrow Lantern", "Kessa Bay", 'Pell "Red" Arno']
    write_passages("flashrag", [CORPUS / "flashrag.jsonl"], out)
    assert pq.read_table(out)["title"].to_pylist()[1] == '"Kessa Bay"'


titles = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=30)
texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=200).filter(str.strip)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(titles, texts), min_size=1, max_size=4))
def test_flashrag_round_trips_any_title_and_text(pairs):
    passages = [{"id": f"p{i}", "title": title, "text": text} for i, (title, text) in enumerate(pairs)]
    # hypothesis reruns the body many times; pytest's tmp_path would be shared across examples.
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = Path(tmp) / "corpus.jsonl"
        assert write_flashrag_jsonl(passages, jsonl) == len(passages)
        back = [{k: p[k] for k in ("id", "title", "text")} for p in read_flashrag(jsonl)]
        assert back == passages
        out = Path(tmp) / "passages.parquet"
        assert write_passages("flashrag", [jsonl], out) == len(passages)
        assert pq.read_table(out).select(["id", "title", "text"]).to_pylist() == passages


# --------------------------------------------------------------------------- QA-set paragraphs


def test_hotpotqa_paragraphs_are_deduplicated_with_content_ids():
    passages = list(read_hotpotqa(QA / "hotpotqa.json"))
    # 3 + 3 context paragraphs, "Verrow Lake" shared between the two questions.
    assert [p["title"] for p in passages] == ["Tamm River", "Ossel Bridge", "Verrow Lake", "Kessa Bay", "Amberline Hills"]
    tamm, bridge, lake = passages[:3]
    assert tamm["id"] == "hotpotqa-546ea2d77c82f669"
    assert tamm["text"] == "The Tamm River rises in the Amberline Hills. It flows south to Kessa Bay."
    assert bridge["id"] == "hotpotqa-722599467990c48d"
    assert lake == {
        "id": "hotpotqa-63c1e2e4c9c87c29",
        "title": "Verrow Lake",
        "text": "Verrow Lake is a cold glacial lake.",
        "source": "hotpotqa",
    }


def test_2wikimultihopqa_sentences_without_leading_space_are_joined_with_one():
    passages = list(read_2wikimultihopqa(QA / "2wikimultihopqa.json"))
    assert [p["title"] for p in passages] == ["Pell Arno", "Dovan Arno", "Ida Marrow"]
    assert passages[0]["id"] == "2wikimultihopqa-28d9690377085e6d"
    assert passages[0]["text"] == "Pell Arno was a fiddler from Ossel. His father was Dovan Arno."
    assert passages[1]["id"] == "2wikimultihopqa-ae8565877a621e26"
    assert passages[1]["text"] == "Dovan Arno was a boatbuilder. He was born in Kessa."


def test_musique_paragraphs_are_deduplicated_with_content_ids():
    passages = list(read_musique(QA / "musique.jsonl"))
    assert [p["title"] for p in passages] == ["Ossel Bridge", "Verrow Lake", "Tamm River", "Amberline Hills"]
    assert passages[0]["id"] == "musique-05e313b7b5cee5ce"
    assert passages[0]["text"] == "Ossel Bridge is a stone bridge over the Tamm River."
    assert passages[2]["id"] == "musique-e36027c8b5ae610b"
    assert passages[1]["id"] == "musique-63c1e2e4c9c87c29"


# --------------------------------------------------------------------------- write_passages


def test_write_passages_writes_the_contract_schema(tmp_path):
    out = tmp_path / "passages.parquet"
    n = write_passages("dpr", [CORPUS / "dpr.tsv"], out, source="wiki-test", batch_rows=2)
    table = pq.read_table(out)
    assert n == table.num_rows == 3
    assert table.schema.equals(PASSAGE_SCHEMA)
    assert table.column("id").to_pylist() == ["1", "2", "3"]
    assert set(table.column("source").to_pylist()) == {"wiki-test"}


def test_content_addressed_inputs_merge_repeated_paragraphs(tmp_path):
    copy = tmp_path / "again.json"
    copy.write_bytes((QA / "hotpotqa.json").read_bytes())
    out = tmp_path / "passages.parquet"
    assert write_passages("hotpotqa", [QA / "hotpotqa.json", copy], out) == 5


def test_duplicate_ids_across_inputs_name_both_places(tmp_path):
    first, second = tmp_path / "a.tsv", tmp_path / "b.tsv"
    first.write_text("id\ttext\ttitle\n1\tone\tOne\n2\ttwo\tTwo\n")
    second.write_text("id\ttext\ttitle\n3\tthree\tThree\n2\tanother two\tTwo\n")
    out = tmp_path / "out" / "passages.parquet"
    with pytest.raises(DataFormatError) as info:
        write_passages("dpr", [first, second], out, batch_rows=1)
    assert str(info.value) == f"{second}:3: field 'id': duplicate passage id '2' (first seen at {first}:3)"
    assert_nothing_written(out)


def test_dpr_stray_quote_does_not_merge_rows(tmp_path):
    # Issue 18 F3: with csv quoting, row 10's opening quote swallowed rows 10-900 into one passage.
    rows = [f"{i}\tpassage number {i} about something\tTitle {i}" for i in range(1, 1001)]
    rows[9] = '10\t"Quoted start of a passage that never closes its quote\tTitle 10'
    rows[899] = '900\tA later passage that has a " in the middle\tTitle 900'
    path = tmp_path / "psgs.tsv"
    path.write_text("id\ttext\ttitle\n" + "\n".join(rows) + "\n")
    out = tmp_path / "passages.parquet"
    assert write_passages("dpr", [path], out) == 1000
    table = pq.read_table(out).to_pylist()
    assert table[9]["text"] == '"Quoted start of a passage that never closes its quote'
    assert table[899]["text"] == 'A later passage that has a " in the middle'
    assert [r["id"] for r in table] == [str(i) for i in range(1, 1001)]


def test_passage_far_above_the_length_distribution_is_a_warning(tmp_path, capsys):
    rows = [f"{i}\t{'word ' * 20}{i}\tT{i}" for i in range(1, 200)]
    rows[41] = f"42\t{'merged rows ' * 1000}\tT42"
    path = tmp_path / "psgs.tsv"
    path.write_text("id\ttext\ttitle\n" + "\n".join(rows) + "\n")
    assert write_passages("dpr", [path], tmp_path / "passages.parquet", batch_rows=50) == 199
    err = capsys.readouterr().err
    assert "warning: 1 passage(s) longer than" in err and f"{path}:43 id '42' (12000 chars)" in err
    capsys.readouterr()
    write_passages("dpr", [CORPUS / "dpr.tsv"], tmp_path / "again.parquet")
    assert "warning" not in capsys.readouterr().err


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="unknown corpus format 'wiki'"):
        list(read_passages("wiki", CORPUS / "dpr.tsv"))


def test_error_survives_pickling():
    error = DataFormatError("x.jsonl", "expected a string", line=17, field="contents")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) == "x.jsonl:17: field 'contents': expected a string"
    assert (again.path, again.line, again.field) == ("x.jsonl", 17, "contents")


# --------------------------------------------------------------------------- malformed input

GOOD_FLASHRAG = '{"id": "a", "contents": "\\"A\\"\\ntext a"}\n'
GOOD_KILT = '{"wikipedia_id": "1", "wikipedia_title": "A", "text": ["A\\n", "text a\\n"]}\n'
GOOD_DPR = "id\ttext\ttitle\n1\ttext one\tOne\n"

# (format, file name, content, line, record, field, message fragment)
MALFORMED = {
    "bad json": ("flashrag", "c.jsonl", GOOD_FLASHRAG + '{"id": "b", "contents": \n', 2, None, None, "invalid JSON"),
    "not an object": ("flashrag", "c.jsonl", GOOD_FLASHRAG + '["b", "x"]\n', 2, None, None, "expected a JSON object"),
    "missing field": ("flashrag", "c.jsonl", GOOD_FLASHRAG + "\n" + '{"id": "b"}\n', 3, None, "contents", "missing"),
    "wrong type": ("flashrag", "c.jsonl", GOOD_FLASHRAG + '{"id": "b", "contents": 7}\n', 2, None, "contents",
                   "expected a string, got a number"),
    "bad id type": ("flashrag", "c.jsonl", '{"id": null, "contents": "\\"B\\"\\nb"}\n', 1, None, "id",
                    "expected a string or integer id, got null"),
    "empty text": ("flashrag", "c.jsonl", GOOD_FLASHRAG + '{"id": "b", "contents": "\\"B\\"\\n  "}\n', 2, None,
                   "contents", "non-empty text"),
    "kilt wrong type": ("kilt", "k.jsonl", GOOD_KILT + '{"wikipedia_id": "2", "wikipedia_title": "B", "text": "b"}\n',
                        2, None, "text", "expected an array, got a string"),
    "kilt paragraph type": ("kilt", "k.jsonl", '{"wikipedia_id": "2", "wikipedia_title": "B", "text": ["B", 3]}\n',
                            1, None, "text[1]", "expected a string"),
    "kilt no paragraphs": ("kilt", "k.jsonl", '{"wikipedia_id": "2", "wikipedia_title": "B", "text": []}\n',
                           1, None, "text", "must not be empty"),
    "tsv columns": ("dpr", "d.tsv", GOOD_DPR + "2\ttext two\n", 3, None, None, "expected 3 tab-separated columns"),
    "tsv empty text": ("dpr", "d.tsv", GOOD_DPR + "2\t\tTwo\n", 3, None, "text", "must not be empty"),
    "tsv header": ("dpr", "d.tsv", "id\ttitle\ttext\n1\tOne\ttext\n", 1, None, None, "expected the header"),
    "not utf-8": ("dpr", "d.tsv", GOOD_DPR + "2\tcaf\xe9\tTwo\n", 3, None, None, "not valid UTF-8"),
    "hotpot paragraph": ("hotpotqa", "h.json",
                         '[{"context": [["A", ["a."]]]},\n {"context": [["B", "not a list"]]}]', None, 1,
                         "context[0]", "expected [title, [sentence, ...]]"),
    "hotpot bad json": ("hotpotqa", "h.json", '[{"context": [["A", ["a."]]]},\n {"context": ]', 2, None, None,
                        "invalid JSON"),
    "musique empty paragraph": ("musique", "m.jsonl",
                                '{"paragraphs": [{"title": "A", "paragraph_text": " "}]}\n', 1, None,
                                "paragraphs[0].paragraph_text", "must not be empty"),
}


def write_raw(path: Path, content: str) -> None:
    # latin-1 keeps "\xe9" a single non-UTF-8 byte for the encoding case; other cases are ASCII.
    path.write_bytes(content.encode("latin-1"))


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_malformed_row_names_place_and_writes_nothing(tmp_path, case):
    fmt, name, content, line, record, field, fragment = MALFORMED[case]
    path = tmp_path / name
    write_raw(path, content)
    out = tmp_path / "out" / "passages.parquet"
    with pytest.raises(DataFormatError) as info:
        # batch_rows=1: the good first row is already in the temporary file when the bad one comes.
        write_passages(fmt, [path], out, batch_rows=1)
    error = info.value
    assert (error.path, error.line, error.record, error.field) == (str(path), line, record, field)
    where = f"{path}:{line}" if line is not None else f"{path}: record {record}"
    assert str(error).startswith(where + (f": field '{field}'" if field else ""))
    assert fragment in str(error)
    assert_nothing_written(out)


@pytest.mark.parametrize(
    ("fmt", "name", "content"),
    [
        ("flashrag", "c.jsonl", ""),
        ("kilt", "k.jsonl", "\n\n"),
        ("dpr", "d.tsv", ""),
        ("dpr", "d.tsv", "id\ttext\ttitle\n"),
        ("hotpotqa", "h.json", "[]"),
        ("2wikimultihopqa", "w.json", ""),
        ("musique", "m.jsonl", ""),
    ],
)
def test_empty_input_is_an_error_and_writes_nothing(tmp_path, fmt, name, content):
    path = tmp_path / name
    path.write_text(content)
    out = tmp_path / "out" / "passages.parquet"
    with pytest.raises(DataFormatError, match="empty file") as info:
        write_passages(fmt, [path], out)
    assert info.value.path == str(path)
    assert_nothing_written(out)


def test_bad_second_input_discards_the_valid_first(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "z", "contents": 1}\n')
    out = tmp_path / "out" / "passages.parquet"
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:1: field 'contents'"):
        write_passages("flashrag", [CORPUS / "flashrag.jsonl", bad], out, batch_rows=1)
    assert_nothing_written(out)
