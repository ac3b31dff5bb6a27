"""scripts/judge_agreement_autograph.py's pure parts: the R_C judge items it builds from a gold and
corrupted graphs, the agreement it reports, and a whole run against a fake judge endpoint on
127.0.0.1 (the measurement itself needs a served LLM; docs/AUTOGRAPH_R1.md)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location("judge_agreement_autograph",
                                               REPO / "scripts/judge_agreement_autograph.py")
ja = importlib.util.module_from_spec(_spec)
sys.modules["judge_agreement_autograph"] = ja  # its dataclass looks its module up there
_spec.loader.exec_module(ja)

from ragrl.rewards.autograph import ConnectivityJudge  # noqa: E402


def _row(qid, question, answer, support, qtype="1hop"):
    return {"id": qid, "question": question, "golden_answers": [answer], "supporting_ids": support,
            "metadata": json.dumps({"type": qtype})}


ROWS = [
    _row("q1", "Which country is Alpha Film from?", "Borduria", ["p1"]),
    _row("q2", "In which country is the city where Dana Yeld was born located?", "Syldavia", ["p2", "p3"], "bridge"),
    _row("q3", "Which country is Beta Film from?", "Carpania", ["p4"]),
    # The answer is in the graph but no path joins it to the film: connectivity says no on gold.
    _row("q4", "Which country is Gamma Film from?", "Zembla", ["p5"]),
    # No true triple names the answer: nothing to corrupt, only the gold item.
    _row("q5", "Which country is Delta Film from?", "Ruritania", ["p6"]),
]
PASSAGES = [{"id": f"p{i}", "title": f"P{i}", "text": "..."} for i in range(1, 7)]
KG = [{"head": h, "relation": r, "tail": t, "source_id": s} for h, r, t, s in [
    ("Alpha Film", "country of origin", "Borduria", "p1"), ("Alpha Film", "director", "Carl Xen", "p1"),
    ("Dana Yeld", "place of birth", "Klow", "p2"), ("Klow", "country", "Syldavia", "p3"),
    ("Beta Film", "country of origin", "Carpania", "p4"),
    ("Gamma Film", "director", "Eve Zoll", "p5"), ("Zembla", "population", "100", "p5"),
    ("Niedzbad", "country", "Borduria", "p5"),
    ("Delta Film", "director", "Carl Xen", "p6")]]


def _cases():
    return ja.judge_cases(ROWS, PASSAGES, KG)


def _by(cases):
    return {(c.id, c.kind): c for c in cases}


def test_gold_items_are_yes_where_the_answer_is_connected_and_corrupted_items_no():
    cases = _cases()
    verdicts = dict(zip(((c.id, c.kind) for c in cases), ConnectivityJudge().judge([c.item for c in cases])))
    assert verdicts[("q1", "gold")] and verdicts[("q2", "gold")] and verdicts[("q3", "gold")]
    assert not verdicts[("q4", "gold")]
    corrupted = {k: v for k, v in verdicts.items() if k[1] != "gold"}
    assert corrupted and not any(corrupted.values())
    # q1, q2, q3 get all four kinds. The retriever never reaches q4's answer and no triple names
    # q5's, so removing or swapping it leaves the judge the gold item's triples: those are left
    # out; another question's passages are still another graph.
    kinds = {(c.id, c.kind) for c in cases}
    for q in ("q1", "q2", "q3"):
        assert {k for i, k in kinds if i == q} == set(ja.KINDS)
    assert {k for i, k in kinds if i == "q4"} == {"gold", "other_passages"}
    assert {k for i, k in kinds if i == "q5"} == {"gold", "other_passages"}


def test_corrupted_graphs_drop_or_replace_the_answer():
    by = _by(_cases())
    texts = lambda key: {t.text() for t in by[key].item.triples}  # noqa: E731
    assert texts(("q2", "gold")) == {"Dana Yeld place of birth Klow", "Klow country Syldavia"}
    assert texts(("q2", "answer_removed")) == {"Dana Yeld place of birth Klow"}
    # The only other object of "country" stands in for Syldavia.
    assert texts(("q2", "answer_swapped")) == {"Dana Yeld place of birth Klow", "Klow country Borduria"}
    # Another object of "country of origin" stands in for Borduria.
    assert texts(("q1", "answer_swapped")) == {"Alpha Film country of origin Carpania", "Alpha Film director Carl Xen"}
    # Another question's passages: none of them names Alpha Film, so the retriever returns nothing.
    assert by[("q1", "other_passages")].item.triples == ()
    assert by[("q1", "other_passages")].item.question == ROWS[0]["question"]
    assert by[("q1", "gold")].item.answers == ("Borduria",)


def test_agreement_counts_and_intervals_on_hand_made_verdicts():
    cases = [c for c in _cases() if c.id in ("q1", "q2")]  # 8 items: 2 gold, 6 corrupted
    reference = ConnectivityJudge().judge([c.item for c in cases])
    assert sum(reference) == 2
    llm = [True] * len(cases)  # a judge that always says yes
    replies = ["Yes"] * (len(cases) - 1) + ["Maybe"]
    result = ja.agreement(cases, reference, llm, replies)
    assert result["all"]["n"] == 8 and result["all"]["agreement"] == pytest.approx(2 / 8)
    assert result["all"]["confusion"] == {"yes/yes": 2, "yes/no": 0, "no/yes": 6, "no/no": 0}
    assert result["all"]["yes"] == {"connectivity": 2, "llm": 8}
    assert result["all"]["kappa"] == pytest.approx(0.0)  # a constant judge agrees only by chance
    assert result["all"]["replies"] == {"unparsed": 1, "yes": 7}
    assert result["gold"]["agreement"] == 1.0 and result["answer_removed"]["agreement"] == 0.0
    low, high = result["all"]["ci95"]
    assert 0.0 <= low <= 0.25 <= high <= 1.0
    perfect = ja.agreement(cases, reference, reference)
    assert perfect["all"]["agreement"] == 1.0 and perfect["all"]["kappa"] == pytest.approx(1.0)
    assert "| answer_removed | 2 | 0.00" in ja.markdown({"agreement": result})


@pytest.mark.parametrize("reply, word", [("Yes.", "yes"), (" NO", "no"), ("Maybe", "unparsed"), (None, "unparsed")])
def test_verdict_word(reply, word):
    assert ja.verdict_word(reply) == word


def _fake_judge(body: dict):
    """Says Yes when the context holds a triple, else No: the connectivity judge's answer on
    these items except q4's gold (answer present, not connected)."""
    user = body["messages"][-1]["content"]
    reply = "No" if "No relevant triples found." in user or "Carpania" in user and "Beta" not in user else "Yes"
    return 200, {"choices": [{"message": {"role": "assistant", "content": reply}}]}


def test_a_run_against_a_served_judge_writes_the_result(tmp_path, chat_server):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, rows in (("qa", ROWS), ("passages", PASSAGES), ("kg", KG)):
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet")
    chat_server.reply = _fake_judge
    # Given without /v1 (as vLLM's root URL): the script adds it; the endpoint serves only /v1/...
    rc = ja.main(["--qa", str(tmp_path / "qa.parquet"), "--passages", str(tmp_path / "passages.parquet"),
                  "--kg", str(tmp_path / "kg.parquet"), "--out", str(tmp_path / "out"),
                  "--base-url", chat_server.url.removesuffix("/v1"), "--served-name", "fake"])
    assert rc == 0
    assert {b["model"] for b in chat_server.seen} == {"fake"}
    result = json.loads((tmp_path / "out/agreement.json").read_text())
    items = [json.loads(line) for line in (tmp_path / "out/items.jsonl").read_text().splitlines()]
    assert len(items) == result["items"] == len(_cases())
    assert all(i["reply"] in ("Yes", "No") for i in items)  # every reply recorded against its item
    assert all(i["llm"] == (i["reply"] == "Yes") for i in items)
    disagree = [(i["id"], i["kind"]) for i in items if i["llm"] != i["connectivity"]]
    # q4's gold (answer not connected) and the corrupted graphs that still hold triples; the fake
    # says No only on empty contexts and on q1's swapped graph.
    assert ("q4", "gold") in disagree and ("q1", "answer_swapped") not in disagree
    assert ("q1", "answer_removed") in disagree
    assert result["agreement"]["all"]["n"] == len(items)
    assert result["agreement"]["all"]["confusion"]["yes/no"] == 0
