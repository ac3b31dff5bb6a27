"""AutoGraph-R1: triple parsing and validity, graph building, both retrievers (PPR checked against
networkx), and the rewards, on hand-made outputs and hand-computed graphs."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest

from ragrl.kg.extraction import Triple, parse_triples, repetition_share, triples_json, unique_triples
from ragrl.kg.text_graph import (
    build_graph,
    name_matches,
    personalized_pagerank,
    ppr_matrix,
    AUTOGRAPH_TRIPLE_QUERY,
    rank_passages,
    rank_passages_autograph,
    seed_entities,
    subgraph_triples,
)
from ragrl.rewards.autograph import (
    ConnectivityJudge,
    JudgeError,
    JudgeItem,
    OpenAIJudge,
    judge_prompt,
    penalised,
    read_verdict,
    recall_at_k,
)

T = Triple


def arr(*triples: tuple[str, str, str]) -> str:
    return json.dumps([{"subject": s, "relation": r, "object": o} for s, r, o in triples], ensure_ascii=False)


# --------------------------------------------------------------------------- parsing and validity


def test_a_clean_array_parses_to_its_triples():
    turn = parse_triples(arr(("Ann Vole", "born in", "Kest"), ("Kest", "located in", "Orra")))
    assert turn.valid and turn.error is None
    assert turn.triples == (T("Ann Vole", "born in", "Kest"), T("Kest", "located in", "Orra"))


@pytest.mark.parametrize("text", [
    'Here are the triples:\n```json\n[{"subject": "A", "relation": "r", "object": "B"}]\n```',
    '[{"subject": "A", "relation": "r", "object": "B"}',  # missing bracket
    "[{'subject': 'A', 'relation': 'r', 'object': 'B'}]",  # single quotes
    '[{"subject": "A", "relation": "r", "object": "B",}]',  # trailing comma
])
def test_repairable_json_is_repaired(text):
    assert parse_triples(text).triples == (T("A", "r", "B"),)


@pytest.mark.parametrize("text,needle", [
    ("I could not find any facts.", "expected a JSON array"),
    ("", "empty"),
    ("   \n", "empty"),
    ("[]", "empty"),
    ('{"subject": "A", "relation": "r", "object": "B"}', "got an object"),
    ("[1, 2]", "item 0 is a number"),
    ('[["A", "r", "B"]]', "item 0 is an array"),
    ('[{"subject": "A", "relation": "r"}]', "lacks object"),
    ('[{"subject": "A", "relation": "r", "object": ""}]', "object must be a non-empty string"),
    ('[{"subject": "  ", "relation": "r", "object": "B"}]', "subject must be"),
    ('[{"subject": 7, "relation": "r", "object": "B"}]', "subject must be"),
    ('[{"subject": ["A"], "relation": null, "object": "B"}]', "subject, relation must be"),
    # one bad item spoils the turn: the authors check every item
    ('[{"subject": "A", "relation": "r", "object": "B"}, {"subject": "A"}]', "item 1 lacks"),
    ("[" * 3000, "not JSON"),
    (None, "not text"),
    (b'[{"subject": "A"}]', "not text"),
])
def test_invalid_turns_say_why_and_never_raise(text, needle):
    turn = parse_triples(text)
    assert not turn.valid and turn.triples == ()
    assert needle in turn.error


def test_empty_array_is_valid_only_when_allowed():
    assert parse_triples("[]", allow_empty=True).valid
    assert parse_triples("[]", allow_empty=True).triples == ()
    assert not parse_triples("nothing", allow_empty=True).valid


def test_huge_arrays_and_huge_turns_are_invalid_not_slow():
    one = {"subject": "A", "relation": "r", "object": "B"}
    assert parse_triples(json.dumps([one] * 1000)).valid
    assert "1001 triples" in parse_triples(json.dumps([one] * 1001)).error
    assert "characters" in parse_triples("x" * 200_001).error


def test_names_with_quotes_and_unicode_survive_and_are_normalised():
    turn = parse_triples(arr(('Zoë "Zo" O\'Neil', "born  in", "北京"), ("Cafe\u0301", "near", "Zoë")))
    assert turn.valid
    assert turn.triples[0] == T('Zoë "Zo" O\'Neil', "born in", "北京")
    assert turn.triples[1].subject == "Café"  # NFC: one code point
    assert parse_triples(triples_json(turn.triples)).triples == turn.triples  # gold targets round-trip


def test_repetition_share_counts_repeats_case_and_space_insensitively():
    a, b = T("A", "r", "B"), T("a ", "R", "b")
    assert repetition_share([]) == 0.0
    assert repetition_share([a, T("C", "r", "D")]) == 0.0
    assert repetition_share([a, b, a, T("C", "r", "D")]) == pytest.approx(0.5)  # 2 unique of 4
    assert repetition_share([a] * 20) == pytest.approx(0.95)
    assert unique_triples([a, b, T("C", "r", "D")]) == [a, T("C", "r", "D")]


# --------------------------------------------------------------------------- graph building

DOCS = [
    ("p1", [T("Ann Vole", "born in", "Kest"), T("Ann Vole", "works for", "Brindle Co")]),
    ("p2", [T("Kest", "located in", "Orra"), T("kest", "LOCATED IN", "orra")]),  # a repeat in other case
    ("p3", [T("Brindle Co", "founded by", "Tam Rook")]),
    ("p4", []),
]


def test_graph_nodes_edges_and_source_edges():
    g = build_graph(DOCS)
    assert g.entities == ("Ann Vole", "Kest", "Brindle Co", "Orra", "Tam Rook")
    assert g.passages == ("p1", "p2", "p3", "p4")
    assert len(g.triples) == 4  # the repeat counts once
    assert list(zip(g.heads.tolist(), g.tails.tolist())) == [(0, 1), (0, 2), (1, 3), (2, 4)]
    sources = {(g.entities[e], g.passages[p]) for e, p in zip(g.source_entity.tolist(), g.source_passage.tolist())}
    assert sources == {("Ann Vole", "p1"), ("Kest", "p1"), ("Brindle Co", "p1"), ("Kest", "p2"), ("Orra", "p2"),
                       ("Brindle Co", "p3"), ("Tam Rook", "p3")}
    assert g.entity_id("KEST") == 1 and g.entity_id("Nobody") is None


def test_empty_graph_builds():
    g = build_graph([])
    assert g.n_nodes == 0 and g.triples == ()


# --------------------------------------------------------------------------- subgraph retriever

CHAIN = [("c", [T("A1", "r", "B1"), T("B1", "r", "C1"), T("C1", "r", "D1"), T("D1", "r", "E1"), T("X1", "r", "Y1")])]


def test_seeds_match_whole_names_in_the_question():
    g = build_graph(DOCS)
    assert name_matches(g, "Where was ann vole born, and who founded Brindle Co.?") == [0, 2]
    assert name_matches(g, "Where was Annvole born?") == []  # no partial-word matches
    assert name_matches(build_graph(CHAIN), "Is A1 related to D1?") == [0, 3]


def test_seed_fallback_by_embedding_only_when_no_name_matches():
    g = build_graph(DOCS)
    vecs = {"question": [1.0, 0.0], "Ann Vole": [0.0, 1.0], "Kest": [0.6, 0.8], "Brindle Co": [0.8, 0.6],
            "Orra": [-1.0, 0.0], "Tam Rook": [0.0, -1.0]}
    embed = lambda texts: np.array([vecs[t] for t in texts])  # noqa: E731
    assert seed_entities(g, "question", embed, fallback_k=2) == [2, 1]
    assert seed_entities(g, "question") == []
    assert seed_entities(g, "Who is Tam Rook?", embed) == [4]


def test_bfs_collects_triples_up_to_three_hops_undirected():
    g = build_graph(CHAIN)
    # From D1 (index 3): hop 1 reaches C1, E1 via triples 2, 3; hop 2 B1 via 1; hop 3 A1 via 0.
    assert subgraph_triples(g, [3], hops=1) == [2, 3]
    assert subgraph_triples(g, [3], hops=2) == [1, 2, 3]
    assert subgraph_triples(g, [3]) == [0, 1, 2, 3]
    assert subgraph_triples(g, [0], hops=3) == [0, 1, 2]  # E1's edge is 4 hops from A1
    assert subgraph_triples(g, []) == [] and subgraph_triples(g, [99]) == []


# --------------------------------------------------------------------------- PPR


def _nx_graph(g) -> nx.Graph:
    ng = nx.Graph()
    ng.add_nodes_from(range(g.n_nodes))
    for h, t in zip(g.heads.tolist(), g.tails.tolist()):
        w = ng.get_edge_data(h, t, {"weight": 0})["weight"]
        ng.add_edge(h, t, weight=w + 1)
    e = len(g.entities)
    for ent, p in zip(g.source_entity.tolist(), g.source_passage.tolist()):
        ng.add_edge(ent, e + p, weight=1)
    return ng


@pytest.mark.parametrize("docs", [
    DOCS,
    CHAIN,
    [("p", [T("A", "r", "B"), T("B", "s", "A"), T("A", "t", "A"), T("B", "r", "C")]), ("q", [T("C", "r", "D")])],
])
def test_personalized_pagerank_matches_networkx(docs):
    g = build_graph(docs)
    rng = np.random.default_rng(0)
    reset = np.zeros(g.n_nodes)
    reset[rng.choice(len(g.entities), size=2, replace=False)] = rng.random(2) + 0.1
    ours = personalized_pagerank(ppr_matrix(g), reset, 0.85)
    theirs = nx.pagerank(_nx_graph(g), alpha=0.85, personalization=dict(enumerate(reset)), weight="weight",
                         tol=1e-12, max_iter=1000)
    np.testing.assert_allclose(ours, [theirs[i] for i in range(g.n_nodes)], atol=1e-9)
    assert ours.sum() == pytest.approx(1.0)


def test_personalized_pagerank_rejects_a_bad_reset_vector():
    g = build_graph(DOCS)
    with pytest.raises(ValueError, match="personalization"):
        personalized_pagerank(ppr_matrix(g), np.zeros(g.n_nodes))
    with pytest.raises(ValueError, match="personalization"):
        personalized_pagerank(ppr_matrix(g), np.ones(3))


def _axis_embedder(vectors: dict[str, list[float]]):
    def embed(texts):
        out = np.array([vectors[t] for t in texts], dtype=float)
        return out / np.linalg.norm(out, axis=1, keepdims=True)
    return embed


def test_passages_are_ranked_by_the_walk_from_the_best_triples():
    # Two islands: {A, B} extracted from p1, {C, D} from p2. The question matches A-r-B best.
    g = build_graph([("p1", [T("A", "r", "B")]), ("p2", [T("C", "r", "D")]), ("p3", [])])
    embed = _axis_embedder({"q": [1, 0], "A r B": [1, 0.1], "C r D": [0.1, 1]})
    top1 = rank_passages(g, "q", embed, top_triples=1)
    assert top1.passage_ids == ("p1",)  # p2's island gets no walk at all; p3 has no node edge
    both = rank_passages(g, "q", embed, top_triples=2)
    assert both.passage_ids == ("p1", "p2") and both.scores[0] > both.scores[1] > 0
    assert recall_at_k(both.passage_ids, ["p2"], k=1) == 0.0 and recall_at_k(both.passage_ids, ["p2"]) == 1.0


def test_personalisation_is_the_mean_score_of_a_nodes_top_triples():
    # B is named by both top triples (scores 0.8 and 0.6 after normalisation: mean 0.7), A by one
    # (0.8), C by one (0.6). Check the walk's reset vector through a graph with no passages edges
    # to change it: compare with networkx run on the same reset.
    g = build_graph([("p", [T("A", "r", "B"), T("B", "r", "C")])])
    embed = _axis_embedder({"q": [1, 0], "A r B": [0.8, 0.6], "B r C": [0.6, 0.8]})
    ranking = rank_passages(g, "q", embed)
    reset = {0: 0.8, 1: 0.7, 2: 0.6, 3: 0.0}
    theirs = nx.pagerank(_nx_graph(g), alpha=0.85, personalization=reset, weight="weight", tol=1e-12)
    assert ranking.passage_ids == ("p",) and ranking.scores[0] == pytest.approx(theirs[3], abs=1e-9)


# --------------------------------------------------------------------------- AutoGraph-R1's own walk


def _query(question: str) -> str:
    return AUTOGRAPH_TRIPLE_QUERY.format(question=question)


def test_autograph_ppr_walks_edges_forward_and_fills_the_ranking_with_unreached_passages():
    # A -> B (p1), C -> D (p2), D -> A (p3); seeds A and B. Forward from them: B, p1, and p3 (A, the
    # object of D-r-A, has a source edge to p3); C, D and p2 lie against the edges' direction.
    docs = [("p1", [T("A", "r", "B")]), ("p2", [T("C", "r", "D")]), ("p3", [T("D", "r", "A")])]
    vectors = {"A r B": [1, 0], "C r D": [0, 1], "D r A": [0, 1], _query("q"): [1, 0], "q": [1, 0]}
    ours = rank_passages_autograph(docs, "q", _axis_embedder(vectors), top_triples=1)
    assert ours.passage_ids[-1] == "p2" and ours.scores[-1] == 0.0  # ranked all the same, last
    assert set(ours.passage_ids[:2]) == {"p1", "p3"} and min(ours.scores[:2]) > 0
    hipporag = rank_passages(build_graph(docs), "q", _axis_embedder(vectors), top_triples=1)
    assert "p2" in hipporag.passage_ids and hipporag.scores[hipporag.passage_ids.index("p2")] > 0  # undirected


def test_autograph_ppr_min_max_normalises_the_seeds():
    # Two islands; the question is nearer A-r-B. Min-max over the two edges gives C-r-D 0, so C and D
    # get no seed and p2 no mass (HippoRAG 2's raw cosine seeds them at 0.1).
    docs = [("p1", [T("A", "r", "B")]), ("p2", [T("C", "r", "D")])]
    vectors = {"A r B": [1, 0.1], "C r D": [0.1, 1], _query("q"): [1, 0], "q": [1, 0]}
    ours = rank_passages_autograph(docs, "q", _axis_embedder(vectors), top_triples=2)
    assert ours.passage_ids == ("p1", "p2") and ours.scores[1] == 0.0
    assert rank_passages(build_graph(docs), "q", _axis_embedder(vectors), top_triples=2).scores[1] > 0


def test_autograph_ppr_mass_by_hand():
    # A -> B, A -> p, B -> p; personalization {A: 1/2, B: 1/2}; p is dangling, so its mass returns
    # along the personalization. networkx's PageRank solves
    #   x = 0.85 (W^T x + x_p v) + 0.15 v,  v = (1/2, 1/2, 0), W rows A: (0, 1/2, 1/2), B: (0, 0, 1).
    seen: list[str] = []

    def embed(texts):
        seen.extend(texts)
        return np.ones((len(texts), 2)) / np.sqrt(2)

    ranking = rank_passages_autograph([("p", [T("A", "r", "B")])], "Who?", embed)
    v = np.array([0.5, 0.5, 0.0])
    walk = np.array([[0, 0.5, 0.5], [0, 0, 1], [0, 0, 0]])
    system = np.eye(3) - 0.85 * (walk.T + np.outer(v, [0, 0, 1]))
    x = np.linalg.solve(system, 0.15 * v)
    assert ranking.passage_ids == ("p",) and ranking.scores[0] == pytest.approx(x[2] / x.sum(), abs=1e-5)
    assert seen == [_query("Who?"), "A r B"]  # the question with their instruction, the triples as they are
    assert _query("Who?").startswith("Instruct: Given a question, retrieve the most relevant knowledge graph triple")


def test_autograph_ppr_keeps_one_edge_per_ordered_pair_the_last_relation():
    seen: list[str] = []

    def embed(texts):
        seen.extend(texts)
        return np.ones((len(texts), 2)) / np.sqrt(2)

    ranking = rank_passages_autograph([("p1", [T("A", "r", "B")]), ("p2", [T("A", "s", "B"), T("a", "r", "B")])],
                                      "q", embed)
    assert seen[1:3] == ["A s B", "a r B"]  # exact strings: "a" is another node; A-r-B was overwritten
    assert set(ranking.passage_ids) == {"p1", "p2"}
    assert rank_passages_autograph([("p1", [])], "q", embed).reason is not None
    nan = rank_passages_autograph([("p1", [T("A", "r", "B")])], "q", lambda texts: np.full((len(texts), 2), np.nan))
    assert nan.passage_ids == () and "did not converge" in nan.reason  # a broken embedder: no ranking, no crash


def test_a_graph_without_triples_gives_recall_zero_and_a_reason(caplog):
    g = build_graph([("p1", []), ("p2", [])])
    with caplog.at_level("INFO", logger="ragrl.kg.text_graph"):
        ranking = rank_passages(g, "q", _axis_embedder({}))
    assert ranking.passage_ids == () and "no triples" in ranking.reason
    assert "no triples" in caplog.text
    assert recall_at_k(ranking.passage_ids, ["p1"]) == 0.0


# --------------------------------------------------------------------------- rewards


def test_recall_at_k():
    ranked = ["p3", "p1", "p9", "p4", "p5", "p2"]
    assert recall_at_k(ranked, ["p1", "p2"]) == 0.5  # p2 is 6th
    assert recall_at_k(ranked, ["p1", "p2"], k=6) == 1.0
    assert recall_at_k(ranked, ["p1", "p1"]) == 1.0
    assert recall_at_k(ranked, []) == 0.0 and recall_at_k([], ["p1"]) == 0.0


def test_repetition_penalty_and_filter():
    assert penalised(1.0, 0.0) == 1.0
    assert penalised(1.0, 0.25) == 0.75
    assert penalised(0.0, 0.5) == -0.5
    assert penalised(1.0, 0.9) == pytest.approx(0.1)  # at the limit: still penalised, not zeroed
    assert penalised(1.0, 0.95) == 0.0
    # The weight: AutoGraph-R1's main scripts run without the penalty (triple_repetition_penalty 0).
    assert penalised(0.5, 0.25, weight=0.0) == 0.5 and penalised(0.5, 0.25, weight=2.0) == 0.0
    assert penalised(1.0, 0.95, weight=0.0) == 0.0  # the limit still zeroes


@pytest.mark.parametrize("triples,answers,expected", [
    # Who employs the person born in Kest? Path Kest - Ann Vole - Brindle Co.
    ([T("Ann Vole", "born in", "Kest"), T("Ann Vole", "works for", "Brindle Co")], ("Brindle Co",), True),
    ([T("Ann Vole", "born in", "Kest"), T("Tim", "works for", "Brindle Co")], ("Brindle Co",), False),  # cut
    ([T("Ann Vole", "born in", "Kest")], ("Brindle Co",), False),  # answer absent
    ([T("Ann Vole", "works for", "brindle co."), T("kest", "birthplace of", "Ann Vole")], ("Brindle Co.", "BC"),
     True),  # case-insensitive names, edges either way
    ([T("Ann Vole", "works for", "BC"), T("Ann Vole", "born in", "Kest")], ("Brindle Co.", "BC"), True),  # alias
    ([T("Ann Vole", "works for", "BC")], ("BC",), False),  # the question names nothing retrieved
    ([], ("Brindle Co",), False),
])
def test_connectivity_judge(triples, answers, expected):
    item = JudgeItem("Who employs the person born in Kest?", answers, tuple(triples))
    assert ConnectivityJudge().judge([item]) == [expected]


def test_connectivity_judge_on_an_answer_the_question_names():
    # Comparison questions name the answer: yes when every named entity has a retrieved fact.
    q = "Who was born first, Ann Vole or Tam Rook?"
    both = (T("Ann Vole", "born", "1950"), T("Tam Rook", "born", "1960"))
    assert ConnectivityJudge().judge([JudgeItem(q, ("Ann Vole",), both),
                                      JudgeItem(q, ("Ann Vole",), both[:1]),
                                      JudgeItem(q, ("Ann Vole",), ())]) == [True, False, False]


def test_judge_prompt_comes_from_files_and_keeps_braces():
    item = JudgeItem("Q {x}?", ("Ans",), (T("a{0}", "r", "b"),))
    system, user = judge_prompt(item)
    assert system["role"] == "system" and "'Yes' or 'No'" in system["content"]
    assert "(a{0}-r->b)" in user["content"] and "Question:Q {x}?" in user["content"]
    assert "True Answer:Ans" in user["content"]
    assert "No relevant triples found." in judge_prompt(JudgeItem("q", ("a",), ()))[1]["content"]


def test_judge_prompt_shows_a_triple_spelling_a_placeholder_as_written():
    # A constructor that writes "{answer}" as an object must not have the gold answer put in its
    # graph for the judge to find (a forged R_C); nor may "{question}" pull in the question.
    item = JudgeItem("Where was Ann Vole born?", ("Port Lund",),
                     (T("Ann Vole", "born in", "{answer}"), T("{question}", "r", "{triples}")))
    content = judge_prompt(item)[1]["content"]
    context = content.split("Question:")[0]
    assert "(Ann Vole-born in->{answer})" in context and "({question}-r->{triples})" in context
    assert "Port Lund" not in context and "Where was" not in context
    assert content.count("Port Lund") == 1 and "True Answer:Port Lund" in content


@pytest.mark.parametrize("text,expected", [("Yes", True), (" yes.", True), ("No", False), ("", False), (None, False)])
def test_read_verdict(text, expected):
    assert read_verdict(text) is expected


def test_openai_judge_over_http(chat_server):
    def reply(body):
        yes = "Brindle" in body["messages"][1]["content"]
        return 200, {"choices": [{"message": {"role": "assistant", "content": "Yes" if yes else "No"}}]}

    chat_server.reply = reply
    judge = OpenAIJudge(chat_server.url, "judge-model", retries=0)
    items = [JudgeItem("q1", ("x",), (T("A", "r", "Brindle"),)), JudgeItem("q2", ("x",), (T("A", "r", "B"),))]
    assert judge.judge(items) == [True, False]
    assert {b["model"] for b in chat_server.seen} == {"judge-model"}
    assert all(b["temperature"] == 0.0 and b["messages"][0]["role"] == "system" for b in chat_server.seen)
    judge.close()


@pytest.mark.parametrize("status,payload,needle", [
    (200, {"nothing": 1}, "without choices"),
    (400, {"error": "bad model"}, "rejected"),
])
def test_openai_judge_failures_raise(chat_server, status, payload, needle):
    chat_server.reply = lambda body: (status, payload)
    judge = OpenAIJudge(chat_server.url, "m", retries=0)
    with pytest.raises(JudgeError, match=needle):
        judge.judge([JudgeItem("q", ("a",), ())])
    judge.close()


# --------------------------------------------------------------------------- endpoints in options


def test_endpoint_entries_are_checked_and_resolved():
    from ragrl.methods.graph_constructor import GraphConstructorOptions
    from ragrl.serving import endpoint_url, registered_endpoint

    with pytest.raises(ValueError, match="judge openai needs judge_endpoint"):
        GraphConstructorOptions(reward="carrier", judge="openai")
    with pytest.raises(ValueError, match="embedding_endpoint.port: unknown setting"):
        GraphConstructorOptions(embedding_endpoint={"model": "m", "port": 8128})
    with pytest.raises(ValueError, match="judge_endpoint.model: the model the endpoint serves is required"):
        GraphConstructorOptions(judge="openai", judge_endpoint={"serve": True})
    with pytest.raises(ValueError, match="exclude each other"):
        GraphConstructorOptions(judge="openai", judge_endpoint={"model": "m", "base_url": "http://x", "serve": True})
    with pytest.raises(ValueError, match="judge_endpoint.serve: false needs judge_endpoint.base_url"):
        GraphConstructorOptions(judge="openai", judge_endpoint={"model": "m", "serve": False})
    external = {"model": "m", "base_url": "http://judge:8129/v1"}
    assert endpoint_url(external) == ("http://judge:8129/v1", "m")
    served = {"model": "Qwen/Qwen2.5-7B-Instruct", "serve": {"served_name": "judge"}}
    with pytest.raises(RuntimeError, match="no server is running for endpoint model 'judge'"):
        endpoint_url(served)
    with registered_endpoint("judge", "http://127.0.0.1:4242"):
        assert endpoint_url(served) == ("http://127.0.0.1:4242", "judge")
    with pytest.raises(RuntimeError):
        endpoint_url(served)


def test_judge_endpoint_reaches_the_judge_over_http(chat_server):
    # The R_C score with judge "openai": the hook resolves the entry and the judge asks the server.
    from ragrl.kg.constructor import Document, Episode
    from ragrl.kg.extraction import parse_triples
    from ragrl.methods.graph_constructor import ConstructorEnvironment, GraphConstructorOptions
    from ragrl.serving import registered_endpoint

    chat_server.reply = lambda body: (200, {"choices": [{"message": {"role": "assistant", "content": "Yes"}}]})
    options = GraphConstructorOptions(reward="carrier", judge="openai",
                                      judge_endpoint={"model": "Qwen/Qwen2.5-7B-Instruct", "serve": True})
    ep = Episode("q1", "Which company employs Ann Vole?", ("Brindle Co",), ("p1",), (Document("p1", "Ann Vole", "x"),))

    class Traj:
        turns = [parse_triples(arr(("Ann Vole", "employer", "Brindle Co")))]
        complete = True

    with registered_endpoint("Qwen/Qwen2.5-7B-Instruct", chat_server.url.removesuffix("/v1")):
        score = ConstructorEnvironment(options).score(ep, Traj())
    assert score.reward == 1.0
    assert [b["model"] for b in chat_server.seen] == ["Qwen/Qwen2.5-7B-Instruct"]


def _embeddings_transport(handler):
    import httpx

    return httpx.MockTransport(lambda request: handler(json.loads(request.content)))


def test_endpoint_encoder_orders_by_index_normalises_and_batches():
    import httpx

    from ragrl.retrieval.endpoint_encoder import EndpointEncoder

    calls = []

    def handler(body):
        calls.append(body["input"])
        # Answered out of order, unnormalised: the client restores input order and unit length.
        data = [{"index": i, "embedding": [float(len(t)), 1.0]} for i, t in enumerate(body["input"])]
        return httpx.Response(200, json={"data": data[::-1]})

    enc = EndpointEncoder("http://e", "m", batch_size=2, transport=_embeddings_transport(handler))
    out = enc.encode_queries(["a", "bbb", "cc"])
    assert calls == [["a", "bbb"], ["cc"]]
    want = np.array([[1, 1], [3, 1], [2, 1]], dtype=float)
    np.testing.assert_allclose(out, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-6)
    assert out.dtype == np.float32


@pytest.mark.parametrize("status,payload,needle", [
    (200, {"data": [{"index": 0, "embedding": [1.0]}]}, "returned 1 embeddings"),  # 2 texts, 1 vector
    (200, {"object": "list"}, "without data"),
    (400, {"error": {"message": "model not found"}}, "rejected"),
    (503, {"error": "loading"}, "unavailable after 1 attempts"),
])
def test_endpoint_encoder_failures_raise(status, payload, needle):
    import httpx

    from ragrl.retrieval.endpoint_encoder import EmbeddingError, EndpointEncoder

    enc = EndpointEncoder("http://e/v1", "m", retries=0,
                          transport=_embeddings_transport(lambda body: httpx.Response(status, json=payload)))
    with pytest.raises(EmbeddingError, match=needle):
        enc.encode_queries(["a", "b"])


def test_openai_judge_without_content_raises_and_off_format_is_counted(chat_server, capsys):
    """A reply without text is no verdict: asked again, then `JudgeError` naming the endpoint (it
    was read as "no", silently zeroing R_C). A reply saying neither yes nor no keeps the authors'
    reading (no), counted and logged; a run of them is a dead judge."""
    item = JudgeItem("q", ("a",), ())
    chat_server.reply = lambda body: (200, {"choices": [{"message": {"role": "assistant", "content": None}}]})
    judge = OpenAIJudge(chat_server.url, "m", retries=1)
    with pytest.raises(JudgeError, match=f"judge at {chat_server.url}/chat/completions answered with no content 2"):
        judge.judge([item])
    assert len(chat_server.seen) == 2

    from ragrl.replies import DEAD_RUN

    chat_server.reply = lambda body: (200, {"choices": [{"message": {"role": "assistant", "content": "The answer is"}}]})
    for _ in range(DEAD_RUN - 1):
        assert judge.judge([item]) == [False]
    assert judge.replies.offformat == DEAD_RUN - 1
    assert "1 of 1 replies off-format, read as no" in capsys.readouterr().err
    with pytest.raises(JudgeError, match=f"the last {DEAD_RUN} replies were all off-format"):
        judge.judge([item])
    judge.close()


def test_the_constructor_reward_logs_the_judge_off_format_replies(chat_server):
    from ragrl.kg.constructor import Document, Episode
    from ragrl.kg.extraction import parse_triples
    from ragrl.methods.graph_constructor import ConstructorEnvironment, GraphConstructorOptions

    chat_server.reply = lambda body: (200, {"choices": [{"message": {"role": "assistant", "content": "Hmm"}}]})
    options = GraphConstructorOptions(reward="carrier", judge="openai",
                                      judge_endpoint={"model": "judge", "base_url": chat_server.url})
    ep = Episode("q1", "Which company employs Ann Vole?", ("Brindle Co",), ("p1",), (Document("p1", "Ann Vole", "x"),))

    class Traj:
        turns = [parse_triples(arr(("Ann Vole", "employer", "Brindle Co")))]
        complete = True

    score = ConstructorEnvironment(options).score(ep, Traj())
    assert score.reward == 0.0 and score.components["judge_offformat"] == 1.0
