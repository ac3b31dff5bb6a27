"""SimpleQA and TruthfulQA loaders on fixtures in their public formats; expected values by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragrl.cli import main
from ragrl.data import QA_SCHEMA, load_qa
from ragrl.errors import DataFormatError

QA = Path(__file__).resolve().parents[2] / "resources" / "fixtures" / "qa"


def rows(fmt: str, path: Path) -> list[dict]:
    table = load_qa(fmt, path)
    assert table.schema.equals(QA_SCHEMA)
    return [{**r, "metadata": json.loads(r["metadata"])} for r in table.to_pylist()]


def test_simpleqa_csv():
    got = rows("simpleqa", QA / "simpleqa.csv")
    assert [r["id"] for r in got] == ["simpleqa-0", "simpleqa-1", "simpleqa-2"]
    # A quoted field keeps its commas and doubled quotes; a quoted newline stays in the question.
    assert [r["question"] for r in got] == [
        "Who received the Ossel Bridge Engineering Medal in 2010?", 'How long, in kilometres, is the "Tamm" river?',
        "In which year did the Verrow Lantern first appear\nin print?"]
    assert [r["golden_answers"] for r in got] == [["Ida Marrow"], ["412"], ["1887"]]
    assert got[0]["metadata"] == {"topic": "Science and technology", "answer_type": "Person",
                                  "urls": ["https://en.wikipedia.org/wiki/Ossel_Bridge", "https://example.org/tamm"]}
    assert got[2]["metadata"]["urls"] == [] and got[0]["supporting_ids"] == []


def test_truthfulqa_csv_and_hf_jsonl():
    got = rows("truthfulqa", QA / "truthfulqa.csv")
    assert [r["id"] for r in got] == ["truthfulqa-0", "truthfulqa-1"]
    assert got[1]["question"] == 'Who wrote "The Verrow Lantern"?'
    # The best answer first, then the other correct answers ("; "-separated), each once.
    assert got[0]["golden_answers"] == ["Nothing in particular happens if you sleep under the Ossel Bridge",
                                        "You wake up", "I have no comment"]
    assert got[1]["golden_answers"] == ["Ida Marrow wrote The Verrow Lantern", "Ida Marrow"]
    assert got[0]["metadata"] == {"best_answer": "Nothing in particular happens if you sleep under the Ossel Bridge",
                                  "incorrect_answers": ["You are cursed by the river", "You turn into a lantern"],
                                  "type": "Adversarial", "category": "Misconceptions",
                                  "source": "https://en.wikipedia.org/wiki/Ossel_Bridge"}
    assert rows("truthfulqa", QA / "truthfulqa_generation.jsonl") == got[:1]


def test_gpqa_csv_shuffles_the_options_per_record_and_keeps_letter_and_text():
    import random

    got = rows("gpqa", QA / "gpqa.csv")
    assert [r["id"] for r in got] == ["gpqa-recA1", "gpqa-recB2"]
    first = got[0]
    # the seeded order, computed here as the reader must: options [right, wrong 1, 2, 3] shuffled
    order = list(range(4))
    random.Random("gpqa:recA1").shuffle(order)
    shown = [["Xenon", "Helium", "Neon", "Argon"][k] for k in order]
    letter = "ABCD"[order.index(0)]
    assert first["question"] == ("Which gas, at room temperature and pressure, is the densest?\n"
                                 + "\n".join(f"({c}) {o}" for c, o in zip("ABCD", shown)))
    assert first["golden_answers"] == [letter, "Xenon", f"({letter}) Xenon"]
    assert first["metadata"] == {"choices": shown, "answer_letter": letter, "record_id": "recA1", "domain": "Chemistry"}
    assert rows("gpqa", QA / "gpqa.csv") == got  # the same order every time
    assert {r["metadata"]["answer_letter"] for r in got} <= set("ABCD")


def test_aime_jsonl_keeps_the_answer_as_written_and_without_leading_zeros():
    got = rows("aime", QA / "aime.jsonl")
    assert [r["id"] for r in got] == ["aime-60", "aime-61"]
    assert got[0]["question"] == "Find the remainder when 7^2024 is divided by 100."
    assert got[0]["golden_answers"] == ["001", "1"] and got[1]["golden_answers"] == ["24"]


def test_chinese_simpleqa_jsonl():
    got = rows("chinese_simpleqa", QA / "chinese_simpleqa.jsonl")
    assert [(r["id"], r["question"], r["golden_answers"]) for r in got] == [
        ("chinese_simpleqa-csqa-1", "氙的原子序数是多少？", ["54"]), ("chinese_simpleqa-csqa-2", "奥塞尔桥位于哪条河上？", ["塔姆河"])]
    assert got[0]["metadata"] == {"primary_category": "自然与自然科学", "secondary_category": "化学"}


@pytest.mark.parametrize("fmt, text, needle", [
    ("gpqa", "Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2\nq,a,b,c\n",
     ":1: missing column\\(s\\) \\['Incorrect Answer 3'\\]"),
    ("gpqa", "Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\nq,a,b,,d\n",
     ":2: field 'Incorrect Answer 2': must not be empty"),
    ("aime", '{"problem": "p", "answer": 1}\n{"problem": "q", "answer": null}\n', ":2: field 'answer': expected a whole number"),
    ("aime", '{"problem": "", "answer": 1}\n', ":1: field 'problem': must not be"),
    ("aime", '{"answer": 1}\n', ":1: missing: the problem under 'question', 'problem' or 'Problem'"),
    ("aime", '{"problem": "p", "answer": "1.5"}\n', ":1: field 'answer': expected a whole number"),
    ("aime", '{"problem": "p", "answer": -3}\n', ":1: field 'answer': expected a whole number"),
    ("aime", '{"problem": "p", "answer": 24.0}\n', ":1: field 'answer': expected a whole number"),
    ("aime", '{"problem": "p", "answer": "\u00b2"}\n', ":1: field 'answer': expected a whole number"),
    ("aime", '{"problem": "p", "answer": " "}\n', ":1: field 'answer': expected a whole number"),
    ("aime", '{"problem": "p", "answer": 3, "id": {"x": 1}}\n', ":1: field 'id': expected a string or integer id"),
    ("chinese_simpleqa", '{"question": "q", "answer": "a", "id": 1.5}\n', ":1: field 'id': expected a string or integer"),
    ("gpqa", "Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3,Record ID\n"
             "q,a,b,c,d, \n", ":2: field 'Record ID': must not be empty"),
    ("chinese_simpleqa", '{"question": "q", "answer": " "}\n', ":1: field 'answer': must not be"),
    ("simpleqa", "metadata,question,answer\n{},q,a\n", ":1: missing column\\(s\\) \\['problem'\\]"),
    ("simpleqa", "metadata,problem,answer\n{},q,a\n{},,a\n", ":3: field 'problem': must not be empty"),
    ("simpleqa", "metadata,problem,answer\n{},q,a\n\"{'topic': \",q,a\n", ":3: field 'metadata': not a dict literal"),
    ("simpleqa", "metadata,problem,answer\n\"__import__('os')\",q,a\n", ":2: field 'metadata': not a dict literal"),
    ("simpleqa", "metadata,problem,answer\n\"{[1]: 2}\",q,a\n", ":2: field 'metadata': not a dict literal"),
    ("simpleqa", "metadata,problem,answer\n{},q\n", ":2: expected 3 fields"),
    ("simpleqa", "metadata,problem,answer\n", "empty file: no questions"),
    ("truthfulqa", "Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source\n"
                   "A,B,Why?,,x,y,z\n", ":2: field 'best_answer': must not be empty"),
])
def test_bad_rows_name_the_line(tmp_path, fmt, text, needle):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(DataFormatError, match=needle):
        load_qa(fmt, path)


def test_cli_writes_nothing_on_bad_input(tmp_path, capsys):
    out = tmp_path / "qa" / "simpleqa.parquet"
    assert main(["qa", "--format", "simpleqa", "--input", str(QA / "simpleqa.csv"), "--out", str(out)]) == 0
    bad = tmp_path / "bad.csv"
    bad.write_text("metadata,problem,answer\n{},,a\n")
    out2 = tmp_path / "qa" / "bad.parquet"
    assert main(["qa", "--format", "simpleqa", "--input", str(bad), "--out", str(out2)]) == 2
    assert "bad.csv:2: field 'problem'" in capsys.readouterr().err and not out2.exists()


def test_knowrl_rl_data():
    got = rows("knowrl", QA / "knowrl_rl.json")
    assert [(r["id"], r["question"], r["golden_answers"]) for r in got] == [
        ("knowrl-0", "How many arches does the Ossel Bridge have?", ["seven arches"]),
        ("knowrl-1", "Who designed the Ossel Bridge?", ["Ida Marrow"])]
    # The ';'-joined KB titles are the method's topic (ragrl.methods.knowrl.topic_of).
    assert got[0]["metadata"] == {"title": "Ossel Bridge;Tamm River;Ossel (town)"}
    from ragrl.methods.knowrl import topic_of

    assert topic_of({"metadata": json.dumps(got[0]["metadata"])}) == "Ossel Bridge;Tamm River;Ossel (town)"
