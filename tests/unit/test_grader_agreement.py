"""scripts/grader_agreement.py's pure parts: the answers it builds and the agreement it reports,
on hand-made rows and grades (the measurement itself needs a served judge; docs/KNOWRL.md)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location("grader_agreement", REPO / "scripts/grader_agreement.py")
ga = importlib.util.module_from_spec(_spec)
sys.modules["grader_agreement"] = ga  # its dataclass looks its module up there
_spec.loader.exec_module(ga)


def _row(q, gold, relation):
    return {"question": q, "golden_answers": [gold],
            "metadata": json.dumps({"hops": [["X", relation, gold]]})}


ROWS = [_row("Where was A born?", "Paris", "born_in"), _row("Where was B born?", "Lyon", "born_in"),
        _row("When was C founded?", "1901", "founded"), _row("When was D founded?", "1,901", "founded")]


def test_every_question_gets_four_answers_with_known_em_grades():
    cases = ga.answer_cases(ROWS)
    by = {(c.question, c.kind): c for c in cases}
    assert by[("Where was A born?", "gold")].em == "correct"
    assert by[("Where was A born?", "sentence")].answer == "I believe the answer is Paris."
    assert by[("Where was A born?", "sentence")].em == "incorrect"
    assert by[("Where was A born?", "refusal")].em == "not_attempted"
    # The wrong answer is the other birthplace, not a year.
    assert by[("Where was A born?", "wrong")].answer == "Lyon"
    assert by[("Where was A born?", "wrong")].em == "incorrect"


def test_a_wrong_answer_never_matches_the_gold_after_normalisation():
    # "1,901" is "1901" after SQuAD normalisation: the only other year is no wrong answer for C,
    # so C's comes from another relation, and every wrong answer is graded incorrect.
    cases = ga.answer_cases(ROWS)
    wrong_c = next(c for c in cases if c.question == "When was C founded?" and c.kind == "wrong")
    assert wrong_c.answer in ("Paris", "Lyon")
    assert all(c.em == "incorrect" for c in cases if c.kind == "wrong")


def test_agreement_per_kind_on_hand_made_grades():
    cases = ga.answer_cases(ROWS[:2])
    kinds = [c.kind for c in cases]
    assert kinds == ["gold", "sentence", "wrong", "refusal"] * 2
    grades = ["correct", "correct", "incorrect", "not_attempted",    # judge right on all, "sentence" differs from EM
              "incorrect", "unparsed", "correct", "not_attempted"]
    result = ga.agreement(cases, grades)
    assert result["gold"]["agreement"] == pytest.approx(0.5)
    assert result["sentence"]["agreement"] == 0.0   # EM says incorrect; the judge said correct and unparsed
    assert result["wrong"]["agreement"] == pytest.approx(0.5)
    assert result["refusal"]["agreement"] == 1.0
    assert result["all"]["n"] == 8 and result["all"]["agreement"] == pytest.approx(4 / 8)
    assert result["sentence"]["judge"] == {"correct": 1, "unparsed": 1}
    low, high = result["all"]["ci95"]
    assert 0.0 <= low <= 0.5 <= high <= 1.0
    assert "| refusal | not_attempted | 2 | 1.00" in ga.markdown({"agreement": result})
