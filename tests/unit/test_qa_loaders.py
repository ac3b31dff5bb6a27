"""QA loaders on small fixtures in the real public formats; expected values written by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragrl.corpus import read_passages
from ragrl.data import QA_SCHEMA, load_qa, write_qa
from ragrl.errors import DataFormatError, InputError

QA = Path(__file__).resolve().parents[2] / "resources" / "fixtures" / "qa"


def column(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist()


def metadata(table: pa.Table) -> list[dict]:
    return [json.loads(text) for text in column(table, "metadata")]


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not out.parent.exists() or os.listdir(out.parent) == []


def test_flashrag_qa():
    table = load_qa("flashrag", QA / "flashrag.jsonl")
    assert table.schema.equals(QA_SCHEMA)
    # Integer ids in the file become strings.
    assert column(table, "id") == ["test_0", "1", "test_2"]
    assert column(table, "question")[0] == "which river flows under ossel bridge?"
    # A repeated answer is kept once.
    assert column(table, "golden_answers") == [["Tamm River", "the Tamm"], ["the Verrow Lantern"], ["Ida Marrow"]]
    assert column(table, "supporting_ids") == [[], [], []]
    assert metadata(table) == [{}, {"popularity": 3, "source": "fictional"}, {}]


def test_hotpotqa_qa():
    table = load_qa("hotpotqa", QA / "hotpotqa.json")
    assert column(table, "id") == ["5a8b57f25542995d1e6f1371", "5a8c7595554299585d9e36b6"]
    assert column(table, "golden_answers") == [["Ossel Bridge"], ["yes"]]
    # Context order, from the supporting_facts titles "Tamm River" and "Ossel Bridge".
    assert column(table, "supporting_ids")[0] == ["hotpotqa-546ea2d77c82f669", "hotpotqa-722599467990c48d"]
    assert column(table, "supporting_ids")[1][0] == "hotpotqa-63c1e2e4c9c87c29"
    first = metadata(table)[0]
    assert first == {"type": "bridge", "level": "medium", "supporting_facts": [["Tamm River", 1], ["Ossel Bridge", 0]]}


def test_2wikimultihopqa_qa():
    table = load_qa("2wikimultihopqa", QA / "2wikimultihopqa.json")
    assert column(table, "golden_answers") == [["Kessa"], ["Ida Marrow"]]
    assert column(table, "supporting_ids")[0] == [
        "2wikimultihopqa-28d9690377085e6d",
        "2wikimultihopqa-ae8565877a621e26",
    ]
    first = metadata(table)[0]
    assert first["type"] == "compositional"
    assert first["evidences"][1] == ["Dovan Arno", "place of birth", "Kessa"]
    assert "level" not in first


def test_musique_qa():
    table = load_qa("musique", QA / "musique.jsonl")
    assert column(table, "id") == ["2hop__4101_4102", "2hop__4103_4104"]
    assert column(table, "golden_answers") == [["Kessa Bay", "Kessa", "the Kessa Bay"], ["Amberline Hills"]]
    # Paragraphs 0 and 2 are flagged is_supporting, paragraph 1 is not.
    assert column(table, "supporting_ids")[0] == ["musique-05e313b7b5cee5ce", "musique-e36027c8b5ae610b"]
    first = metadata(table)[0]
    assert first["answerable"] is True
    assert [step["answer"] for step in first["question_decomposition"]] == ["Tamm River", "Kessa Bay"]


@pytest.mark.parametrize(
    ("fmt", "name"),
    [("hotpotqa", "hotpotqa.json"), ("2wikimultihopqa", "2wikimultihopqa.json"), ("musique", "musique.jsonl")],
)
def test_supporting_ids_join_the_corpus_built_from_the_same_file(fmt, name):
    table = load_qa(fmt, QA / name)
    corpus_ids = {p["id"] for p in read_passages(fmt, QA / name)}
    supporting = column(table, "supporting_ids")
    assert all(len(ids) == 2 for ids in supporting)
    assert {i for ids in supporting for i in ids} <= corpus_ids


def test_write_qa_round_trips_through_parquet(tmp_path):
    out = tmp_path / "qa.parquet"
    assert write_qa("musique", QA / "musique.jsonl", out) == 2
    table = pq.read_table(out)
    assert table.schema.equals(QA_SCHEMA)
    assert table.equals(load_qa("musique", QA / "musique.jsonl"))


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="unknown QA format 'squad'"):
        load_qa("squad", QA / "flashrag.jsonl")


GOOD = '{"id": "q1", "question": "what?", "golden_answers": ["it"]}\n'
MUSIQUE = {
    "id": "m1",
    "paragraphs": [{"idx": 0, "title": "A", "paragraph_text": "a.", "is_supporting": True}],
    "question": "q?",
    "answer": "a",
    "answer_aliases": [],
}
HOTPOT = {
    "_id": "h1",
    "question": "q?",
    "answer": "a",
    "supporting_facts": [["A", 0]],
    "context": [["A", ["a."]]],
}


def jsonl(*records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


# (format, file name, content, line, record, field, message fragment)
MALFORMED = {
    "bad json": ("flashrag", "q.jsonl", GOOD + "{oops\n", 2, None, None, "invalid JSON"),
    "missing question": ("flashrag", "q.jsonl", GOOD + '{"id": "q2", "golden_answers": ["x"]}\n', 2, None,
                         "question", "missing"),
    "answers not a list": ("flashrag", "q.jsonl", GOOD + '{"id": "q2", "question": "q", "golden_answers": "x"}\n',
                           2, None, "golden_answers", "expected an array, got a string"),
    "empty answer": ("flashrag", "q.jsonl", GOOD + '{"id": "q2", "question": "q", "golden_answers": ["x", ""]}\n',
                     2, None, "golden_answers[1]", "must not be empty"),
    "metadata not an object": ("flashrag", "q.jsonl",
                               GOOD + '{"id": "q2", "question": "q", "golden_answers": ["x"], "metadata": [1]}\n',
                               2, None, "metadata", "expected an object"),
    "duplicate id": ("flashrag", "q.jsonl", GOOD + GOOD, 2, None, "id", "duplicate question id 'q1'"),
    "hotpot missing answer": ("hotpotqa", "h.json",
                              json.dumps([HOTPOT, {k: v for k, v in HOTPOT.items() if k != "answer"}]),
                              None, 1, "answer", "missing"),
    "hotpot bad fact": ("hotpotqa", "h.json", json.dumps([{**HOTPOT, "supporting_facts": [["A", "0"]]}]),
                        None, 0, "supporting_facts[0]", "expected [title, sentence index]"),
    "musique flag type": ("musique", "m.jsonl",
                          jsonl(MUSIQUE, {**MUSIQUE, "id": "m2",
                                          "paragraphs": [{**MUSIQUE["paragraphs"][0], "is_supporting": "yes"}]}),
                          2, None, "paragraphs[0].is_supporting", "expected a boolean, got a string"),
    "musique aliases type": ("musique", "m.jsonl", jsonl({**MUSIQUE, "answer_aliases": "b"}), 1, None,
                             "answer_aliases", "expected an array"),
    "empty file": ("musique", "m.jsonl", "", None, None, None, "empty file"),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_malformed_question_names_place_and_writes_nothing(tmp_path, case):
    fmt, name, content, line, record, field, fragment = MALFORMED[case]
    path = tmp_path / name
    path.write_text(content)
    out = tmp_path / "out" / "qa.parquet"
    with pytest.raises(DataFormatError) as info:
        write_qa(fmt, path, out)
    error = info.value
    assert (error.path, error.line, error.record, error.field) == (str(path), line, record, field)
    where = str(path) if line is None else f"{path}:{line}"
    if record is not None:
        where += f": record {record}"
    assert str(error).startswith(where + (f": field '{field}'" if field else ""))
    assert fragment in str(error)
    assert_nothing_written(out)


# --------------------------------------------------------------------------- mixed QA sets and corpora
# AutoGraph-R1 trains on MuSiQue + HotpotQA: one QA table from both files, one corpus from both
# files' paragraphs, the supporting ids of either joining that corpus.


def test_mixed_qa_holds_both_sets_shuffled_reproducibly():
    files = [QA / "musique.jsonl", QA / "hotpotqa.json"]
    mixed = load_qa(["musique", "hotpotqa"], files)
    alone = {f: load_qa(f, p) for f, p in zip(["musique", "hotpotqa"], files)}
    ids = mixed.column("id").to_pylist()
    assert sorted(ids) == sorted(i for t in alone.values() for i in t.column("id").to_pylist())
    assert mixed.to_pylist() == load_qa(["musique", "hotpotqa"], files).to_pylist()  # same seed, same order
    # A different seed is a different order of the same questions (4 questions: 24 orders).
    orders = {tuple(load_qa(["musique", "hotpotqa"], files, seed=s).column("id").to_pylist()) for s in range(6)}
    assert len(orders) > 1 and all(sorted(o) == sorted(ids) for o in orders)
    # Each row is the row its own loader gives.
    by_id = {r["id"]: r for t in alone.values() for r in t.to_pylist()}
    assert all(r == by_id[r["id"]] for r in mixed.to_pylist())


def test_mixed_supporting_ids_join_the_mixed_corpus(tmp_path):
    from ragrl.corpus import write_passages

    files = [QA / "musique.jsonl", QA / "hotpotqa.json"]
    out = tmp_path / "passages.parquet"
    n = write_passages(["musique", "hotpotqa"], files, out)
    corpus = pq.read_table(out).to_pylist()
    assert n == len(corpus) == len({p["id"] for p in corpus})
    # Each passage keeps the format it came from as its source; both formats are present.
    assert {p["source"] for p in corpus} == {"musique", "hotpotqa"}
    assert all(p["id"].startswith(p["source"]) for p in corpus)
    ids = {p["id"] for p in corpus}
    supporting = [s for r in load_qa(["musique", "hotpotqa"], files).to_pylist() for s in r["supporting_ids"]]
    assert supporting and set(supporting) <= ids


def test_mixed_inputs_must_pair_formats_with_files(tmp_path):
    from ragrl.corpus import write_passages

    with pytest.raises(ValueError, match="2 QA formats for 1 files"):
        load_qa(["musique", "hotpotqa"], [QA / "musique.jsonl"])
    with pytest.raises(ValueError, match="unknown QA format 'musiq'"):
        load_qa(["musique", "musiq"], [QA / "musique.jsonl", QA / "hotpotqa.json"])
    with pytest.raises(ValueError, match="1 formats for 2 inputs"):
        write_passages(["musique"], [QA / "musique.jsonl", QA / "hotpotqa.json"], tmp_path / "p.parquet")
    assert not (tmp_path / "p.parquet").exists()


def test_mixed_qa_rejects_a_question_id_in_both_files(tmp_path):
    # The same file twice: every id repeats; the error names the second file and the first place.
    with pytest.raises(DataFormatError, match=r"musique-copy\.jsonl.*duplicate question id '2hop__4101_4102'"):
        copy = tmp_path / "musique-copy.jsonl"
        copy.write_text((QA / "musique.jsonl").read_text())
        load_qa("musique", [QA / "musique.jsonl", copy])
    out = tmp_path / "qa.parquet"
    with pytest.raises(DataFormatError):
        write_qa("musique", [QA / "musique.jsonl", copy], out)
    assert not out.exists()


@pytest.mark.parametrize("meta, needle", [("{not json", "not a JSON object"), ("[1, 2]", "expected a JSON object, got list"),
                                          (3, "not a JSON object")])
def test_row_metadata_that_is_not_an_object_names_the_row(meta, needle):
    from ragrl.data.qa import row_golds, row_metadata
    from ragrl.train.kg_sft_data import topic_entities

    row = {"id": "kgqa-7", "question": "q", "golden_answers": ["a"], "metadata": meta}
    for read in (row_metadata, row_golds, topic_entities):
        with pytest.raises(InputError, match=f"QA row 'kgqa-7': metadata: {needle}"):
            read(row)
    ok = {"id": "x", "golden_answers": ["a"], "metadata": '{"answers": [{"text": "A", "kb_id": "m.1"}], "topic_entities": ["m.0"]}'}
    assert row_golds(ok) == [{"text": "A", "kb_id": "m.1"}] and topic_entities(ok) == ["m.0"]
    assert row_golds({"id": "y", "golden_answers": ["b"]}) == ["b"] and row_metadata({"id": "y"}) == {}
