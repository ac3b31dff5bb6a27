"""Oracle retrieval (the upper-bound row): every query gets its own question's supporting passages."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragrl.agent.environments import SearchEnvironment
from ragrl.agent.protocol import parse_action
from ragrl.agent.retriever_adapter import AgentRetriever
from ragrl.retrieval import Hit
from ragrl.retrieval.oracle import OracleRetriever


@pytest.fixture()
def files(tmp_path):
    passages = tmp_path / "passages.parquet"
    pq.write_table(pa.table({
        "id": ["p1", "p2", "p3", "p4"],
        "title": ["Ada Lin", "Port Vale", "Bo Chen", "Tide Works"],
        "text": ["Ada Lin was born in Port Vale.", "Port Vale lies in Norland.", "Bo Chen works for Tide Works.",
                 "Tide Works was founded in 1950."],
    }), passages)
    qa = tmp_path / "qa.parquet"
    pq.write_table(pa.table({
        "id": ["q1", "q2"],
        "question": ["In which country was Ada Lin born?", "When was Bo Chen's employer founded?"],
        "golden_answers": [["Norland"], ["1950"]],
        "supporting_ids": [["p1", "p2"], ["p3", "p4"]],
    }), qa)
    return passages, qa


def test_each_query_gets_its_questions_passages_best_overlap_first(files):
    oracle = OracleRetriever(*files)
    hits = oracle.search_for(["Where is Port Vale?", "Ada Lin birthplace", "Who employs Bo Chen?"], 2,
                             ["q1", "q1", "q2"])
    assert [[h.id for h in hs] for hs in hits] == [["p2", "p1"], ["p1", "p2"], ["p3", "p4"]]
    # top-k cuts like any retriever; an unknown question gets nothing rather than another's passages
    assert [h.id for h in oracle.search_for(["Port Vale"], 1, ["q1"])[0]] == ["p2"]
    assert oracle.search_for(["anything"], 3, ["q9"]) == [[]]
    with pytest.raises(ValueError, match="needs the question of each query"):
        oracle.search(["Ada Lin"], 2)


class _Fill:
    """A real retriever's stand-in: fixed hits, best first, and the calls it got."""

    def __init__(self, ids):
        self.ids, self.calls = ids, []

    def search(self, queries, topk):
        self.calls.append((list(queries), topk))
        return [[Hit(i, "t", "x", 1.0 - k / 10) for k, i in enumerate(self.ids[:topk])] for _ in queries]


def test_fill_tops_a_short_gold_list_up_to_topk_without_repeats(files):
    fill = _Fill(["p2", "p9", "p8", "p7"])
    oracle = OracleRetriever(*files, fill=fill)
    hits = oracle.search_for(["Where is Port Vale?", "Who employs Bo Chen?"], 3, ["q1", "q2"])
    # Gold first (ranked as without fill), then the retriever's best that are not gold already.
    assert [[h.id for h in hs] for hs in hits] == [["p2", "p1", "p9"], ["p3", "p4", "p2"]]
    # An unknown question gets the retriever's hits only; a full gold list asks the retriever nothing.
    assert [h.id for h in oracle.search_for(["x"], 2, ["nope"])[0]] == ["p2", "p9"]
    fill.calls.clear()
    assert [h.id for h in oracle.search_for(["Port Vale"], 2, ["q1"])[0]] == ["p2", "p1"]
    assert fill.calls == []


def test_missing_supporting_passage_names_the_files(files, tmp_path):
    passages, _ = files
    qa = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["q1"], "question": ["x"], "golden_answers": [["y"]],
                             "supporting_ids": [["p1", "p77"]]}), qa)
    with pytest.raises(ValueError, match=r"bad\.parquet.*p77.*passages\.parquet"):
        OracleRetriever(passages, qa)


def test_the_search_environment_hands_each_action_its_questions_evidence(files):
    env = SearchEnvironment(AgentRetriever(OracleRetriever(*files)), topk=2)
    actions = [parse_action("<search>Ada Lin</search>", env.spec), parse_action("<search>Bo Chen</search>", env.spec),
               parse_action("<answer>1950</answer>", env.spec)]
    first, second, answer = env.respond(actions, sample_ids=["q1", "q2", "q2"])
    assert "Ada Lin was born in Port Vale." in first and "Bo Chen" not in first
    assert "Tide Works was founded in 1950." in second and "Ada Lin" not in second
    assert answer is None
