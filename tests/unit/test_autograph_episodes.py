"""AutoGraph-R1's constructor episodes on the tiny policy's real chat template: per-document turns,
loss only on the constructor's turns, invalid turns ending the episode, gold SFT transcripts that
are token for token what a rollout of the gold answers produces, the episode rewards, and the chain
that carries RL's effect on the toy (a graph that parses made likelier than a cut one)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import transformers

from ragrl.errors import InputError
from ragrl.kg.constructor import (
    ChatFrame,
    ConstructorRollout,
    Document,
    Episode,
    carrier_scores,
    document_message,
    episodes_from_world,
    gold_transcript,
    gold_triples_by_passage,
    index_score,
)
from ragrl.kg.extraction import Triple, parse_triples, triples_json
from ragrl.methods import get_method
from ragrl.recipe import parse_recipe
from ragrl.rewards.autograph import ConnectivityJudge

from helpers import world_and_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("autograph")
    world, model_dir = world_and_model(root)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    gold = gold_triples_by_passage(pq.read_table(root / "world/kg/B/triples.parquet").to_pylist())
    qa = [r for r in world.qa["train"] if len(r["supporting_ids"]) == 2][:4]
    return SimpleNamespace(root=root, world=world, model_dir=model_dir, tok=tok, gold=gold, qa=qa,
                           episodes=episodes_from_world(qa, world.passages))


class ScriptedGenerator:
    """Answers each turn by the title of the document it was last shown: `script(title, k)` is
    the reply text (k: which document of the episode), encoded and closed with eos."""

    def __init__(self, tok, script):
        self.tok, self.script, self.calls = tok, script, []

    def generate(self, batch_token_ids, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, *,
                 stop_token_ids=(), stop_strings=()):
        self.calls.append(len(batch_token_ids))
        out = []
        for ids in batch_token_ids:
            context = self.tok.decode(ids)
            titles = re.findall(r"Extracts for (.*?): ", context)
            out.append(self.tok.encode(self.script(titles[-1], len(titles) - 1), add_special_tokens=False)
                       + [self.tok.eos_token_id])
        return out


def _gold_script(t):
    by_title = {d.title: d.id for e in t.episodes for d in e.documents}
    return lambda title, k: triples_json(t.gold.get(by_title[title], []))


def test_document_message():
    assert document_message(Document("p", "Kest", "Kest is a town."), 0) == "Extracts for Kest: Kest is a town."
    assert document_message(Document("p", " ", "Text."), 2) == "Extracts for Document 3: Text."


def test_episodes_hold_the_supporting_passages_shuffled_and_reproducible(tiny):
    for row, ep in zip(tiny.qa, tiny.episodes):
        assert sorted(d.id for d in ep.documents) == sorted(row["supporting_ids"])
        assert ep.supporting_ids == tuple(row["supporting_ids"])
    assert episodes_from_world(tiny.qa, tiny.world.passages) == tiny.episodes
    with pytest.raises(ValueError, match="not in the passages"):
        episodes_from_world([{**tiny.qa[0], "supporting_ids": ["nope"]}], tiny.world.passages)
    # Without supporting passages an episode's recall is 0 whatever the graph: refused, named.
    for empty in ([], None):
        with pytest.raises(ValueError, match=rf"question {tiny.qa[1]['id']}: no supporting_ids"):
            episodes_from_world([tiny.qa[0], {**tiny.qa[1], "supporting_ids": empty}], tiny.world.passages)


def test_hard_negatives_come_from_the_retriever_and_skip_supporting_passages(tiny):
    row = tiny.qa[0]
    others = [p for p in tiny.world.passages if p["id"] not in row["supporting_ids"]]
    ranked = [{"id": row["supporting_ids"][0]}, {"id": others[0]["id"]}, {"id": others[0]["id"]},
              {"id": others[1]["id"]}, {"id": others[2]["id"]}]
    ep = episodes_from_world([row], tiny.world.passages, negatives=2, search=lambda qs, k: [ranked])[0]
    assert sorted(d.id for d in ep.documents) == sorted([*row["supporting_ids"], others[0]["id"], others[1]["id"]])
    assert ep.supporting_ids == tuple(row["supporting_ids"])
    # AutoGraph-R1's DOC_SIZE: the count is of documents in all, the supporting ones included.
    n_support = len(row["supporting_ids"])
    for total, negs in ((n_support + 1, [others[0]["id"]]), (n_support, []), (n_support + 3, [o["id"] for o in others[:3]])):
        ep = episodes_from_world([row], tiny.world.passages, negatives=total, search=lambda qs, k: [ranked],
                                 in_all=True)[0]
        assert sorted(d.id for d in ep.documents) == sorted([*row["supporting_ids"], *negs]), total


def test_hard_negatives_per_supporting_passage_split_the_count_and_skip_what_is_taken():
    # AutoGraph-R1's data_preparation.py: DOC_SIZE 7 with 2 supporting passages leaves 5 negatives,
    # 2 each and 1 more for one of them (a random one); each supporting passage's text is the query
    # for its own; a passage another one took, or a supporting one, is skipped.
    passages = [{"id": i, "title": i.upper(), "text": f"about {i}"} for i in ("s1", "s2", *(f"n{j}" for j in range(8)))]
    nearest = {"S1: about s1": ["s1", "n0", "n1", "s2", "n2", "n3"], "S2: about s2": ["s2", "n0", "n4", "n5", "n6"]}
    queries: list[list[str]] = []

    def search(qs, k):
        queries.append(list(qs))
        return [[{"id": i} for i in nearest[q][:k]] for q in qs]

    row = {"id": "q", "question": "Q?", "golden_answers": ["x"], "supporting_ids": ["s1", "s2"]}
    ep = episodes_from_world([row], passages, negatives=7, search=search, in_all=True, negatives_from="supporting")[0]
    assert queries == [["S1: about s1", "S2: about s2"]]
    ids = {d.id for d in ep.documents}
    assert len(ep.documents) == 7 and {"s1", "s2"} <= ids
    from_s1 = ids & {"n0", "n1", "n2", "n3"}
    assert from_s1 in ({"n0", "n1"}, {"n0", "n1", "n2"})  # its nearest first, s2 skipped
    from_s2 = ids & {"n4", "n5", "n6"}
    assert from_s2 in ({"n4", "n5"}, {"n4", "n5", "n6"})  # n0 taken by s1 already: skipped
    assert len(from_s1) + len(from_s2) == 5
    # the random start of the remainder varies over questions (seeded per question)
    extra_to_s1 = {len(ids_ & {"n2"}) for ids_ in (
        {d.id for d in episodes_from_world([{**row, "id": f"q{i}"}], passages, negatives=7, search=search,
                                           in_all=True, negatives_from="supporting")[0].documents}
        for i in range(12))}
    assert extra_to_s1 == {0, 1}
    with pytest.raises(ValueError, match="negatives_from must be one of"):
        episodes_from_world([row], passages, negatives=7, search=search, negatives_from="answers")


def test_the_methods_episodes_honour_documents_in_all(tiny):
    from ragrl.methods.graph_constructor import ConstructorEnvironment, GraphConstructorOptions

    row = tiny.qa[0]
    others = [p for p in tiny.world.passages if p["id"] not in row["supporting_ids"]]
    retriever = SimpleNamespace(passages=SimpleNamespace(table=pa.Table.from_pylist(tiny.world.passages)),
                                search=lambda qs, k: [[{"id": o["id"]} for o in others[:k]] for _ in qs])
    sizes = [len(ConstructorEnvironment(GraphConstructorOptions(negatives=5, documents_in_all=flag), retriever)
                 .episodes([row])[0].documents) for flag in (False, True)]
    assert sizes == [len(row["supporting_ids"]) + 5, 5]


def test_rollout_feeds_one_document_per_turn_and_masks_all_but_the_constructor(tiny):
    gen = ScriptedGenerator(tiny.tok, _gold_script(tiny))
    trajs = ConstructorRollout(gen, tiny.tok).run(tiny.episodes, n=2)
    assert gen.calls == [8, 8]  # two documents each: one batched call per turn
    for t in trajs:
        ep = tiny.episodes[t.prompt_index]
        assert t.complete and len(t.turns) == 2
        assert [list(turn.triples) for turn in t.turns] == [tiny.gold[d.id] for d in ep.documents]
        trained = [i for i, m in zip(t.response_ids, t.loss_mask) if m]
        expected = [tiny.tok.encode(triples_json(tiny.gold[d.id]), add_special_tokens=False) + [tiny.tok.eos_token_id]
                    for d in ep.documents]
        assert trained == expected[0] + expected[1]
        context = tiny.tok.decode([i for i, m in zip(t.response_ids, t.loss_mask) if not m])
        assert context == f"\n<|im_start|>user\n{document_message(ep.documents[1], 1)}<|im_end|>\n<|im_start|>assistant\n"
        assert sorted(set(t.turn_index)) == [0, 1]


def test_gold_transcript_is_the_rollout_of_the_gold_answers(tiny):
    frame = ChatFrame(tiny.tok)
    traj = ConstructorRollout(ScriptedGenerator(tiny.tok, _gold_script(tiny)), tiny.tok).run(tiny.episodes[:1])[0]
    row = gold_transcript(tiny.episodes[0], tiny.gold, frame)
    assert row["input_ids"] == traj.prompt_ids + traj.response_ids
    assert row["assistant_masks"] == [0] * len(traj.prompt_ids) + traj.loss_mask
    assert row["num_turns"] == 2 and row["text"].startswith("<|im_start|>system\nYou are a knowledge graph")


def test_an_invalid_turn_ends_the_episode_and_scores_zero(tiny):
    script = lambda title, k: "I am not sure." if k == 0 else "[]"  # noqa: E731
    t = ConstructorRollout(ScriptedGenerator(tiny.tok, script), tiny.tok).run(tiny.episodes[:1])[0]
    assert t.stop_reason == "invalid" and not t.complete and len(t.turns) == 1
    assert "expected a JSON array" in t.turns[0].error
    s = index_score(tiny.episodes[0], t.turns, t.complete, _bag_of_words)
    assert s.reward == 0.0 and s.components["valid"] == 0.0


def test_empty_arrays_end_the_episode_unless_allowed(tiny):
    empty = lambda title, k: "[]"  # noqa: E731
    strict = ConstructorRollout(ScriptedGenerator(tiny.tok, empty), tiny.tok).run(tiny.episodes[:1])[0]
    lenient = ConstructorRollout(ScriptedGenerator(tiny.tok, empty), tiny.tok, allow_empty=True).run(tiny.episodes[:1])[0]
    assert strict.stop_reason == "invalid" and lenient.stop_reason == "done"
    # A complete episode whose graph has no triples: recall 0, with the reason.
    s = index_score(tiny.episodes[0], lenient.turns, True, _bag_of_words)
    assert s.reward == 0.0 and "no triples" in s.reason


def test_response_budget_ends_an_episode_before_the_next_document(tiny):
    gen = ScriptedGenerator(tiny.tok, _gold_script(tiny))
    t = ConstructorRollout(gen, tiny.tok, max_response_tokens=40).run(tiny.episodes[:1])[0]
    assert t.stop_reason in ("response_limit", "invalid") and not t.complete
    assert len(t.response_ids) <= 40


@pytest.mark.slow
def test_a_random_policy_never_breaks_the_rollout(tiny):
    from ragrl.agent.generation import HFGenerator

    gen = HFGenerator.from_pretrained(tiny.model_dir, dtype="float32")
    trajs = ConstructorRollout(gen, tiny.tok, max_turn_tokens=12).run(tiny.episodes[:2], n=2, seed=1)
    for t in trajs:
        assert len(t.response_ids) == len(t.loss_mask) == len(t.turn_index) and t.stop_reason
        assert index_score(tiny.episodes[t.prompt_index], t.turns, t.complete, _bag_of_words).reward == 0.0


def _bag_of_words(texts):
    """A deterministic stand-in for the sentence encoder: normalised word counts."""
    words = [re.findall(r"\w+", t.lower()) for t in texts]
    vocab = sorted({w for ws in words for w in ws})
    out = np.array([[ws.count(w) for w in vocab] for ws in words], dtype=float) + 1e-9
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_r_i_under_autograph_r1s_walk_credits_passages_the_walk_never_reached():
    # Their top 5 is filled with every passage node in document order when fewer are reached, so an
    # episode of 3 documents scores recall 1 at k=5 whatever the walk does; HippoRAG 2's ranking
    # leaves the unreached supporting passage out.
    from ragrl.methods.graph_constructor import GraphConstructorOptions

    docs = (Document("p1", "Zed", "x"), Document("p2", "Ann Vole", "y"), Document("p3", "Kest", "z"))
    ep = Episode("q1", "Which company employs Ann Vole?", ("Brindle Co",), ("p1",), docs)
    turns = [parse_triples('[{"subject": "Zed", "relation": "near", "object": "Yon"}]'),
             parse_triples('[{"subject": "Ann Vole", "relation": "employer", "object": "Brindle Co"}]'),
             parse_triples('[{"subject": "Kest", "relation": "country", "object": "Orra"}]')]
    assert index_score(ep, turns, True, _bag_of_words, k=5, top_triples=1).reward == 0.0
    assert index_score(ep, turns, True, _bag_of_words, k=5, top_triples=1, ppr="autograph").reward == 1.0
    assert index_score(ep, turns, True, _bag_of_words, k=1, top_triples=1, ppr="autograph").reward == 0.0
    with pytest.raises(ValueError, match="ppr must be one of"):
        GraphConstructorOptions(ppr="igraph")


def test_episode_rewards_on_a_hand_made_episode():
    docs = (Document("p1", "Ann Vole", "x"), Document("p2", "Kest", "y"), Document("p3", "Orra", "z"))
    ep = Episode("q1", "Which company employs Ann Vole?", ("Brindle Co",), ("p1",), docs)
    good = [parse_triples('[{"subject": "Ann Vole", "relation": "employer", "object": "Brindle Co"}]'),
            parse_triples('[{"subject": "Kest", "relation": "country", "object": "Orra"}]'),
            parse_triples('[{"subject": "Orra", "relation": "capital", "object": "Kest"}]')]
    r_i = index_score(ep, good, True, _bag_of_words, k=1)
    assert r_i.reward == 1.0 and r_i.components["repetition"] == 0.0
    r_c = carrier_scores([ep], [(0, good, True), (0, good[1:], True), (0, good, False)], ConnectivityJudge())
    assert [s.reward for s in r_c] == [1.0, 0.0, 0.0]
    # Repeating the employer triple twice more: 2 of 5 repeat -> 1 - 0.4.
    rep = good[:1] * 3 + good[1:]
    assert carrier_scores([ep], [(0, rep, True)], ConnectivityJudge())[0].reward == pytest.approx(0.6)
    assert carrier_scores([ep], [(0, rep, True)], ConnectivityJudge(), penalty=0.0)[0].reward == 1.0
    assert index_score(ep, rep, True, _bag_of_words, k=1, penalty=0.5).reward == pytest.approx(0.8)
    spam = [parse_triples(triples_json([Triple("Ann Vole", "employer", "Brindle Co")] * 11))]
    assert carrier_scores([Episode("q", ep.question, ep.golden_answers, ("p1",), docs[:1])], [(0, spam, True)],
                          ConnectivityJudge())[0].reward == 0.0  # 10 of 11 repeat: > 0.9


def test_the_methods_score_applies_its_repetition_penalty():
    from ragrl.methods.graph_constructor import ConstructorEnvironment, GraphConstructorOptions

    docs = (Document("p1", "Ann Vole", "x"),)
    ep = Episode("q1", "Which company employs Ann Vole?", ("Brindle Co",), ("p1",), docs)
    one = parse_triples('[{"subject": "Ann Vole", "relation": "employer", "object": "Brindle Co"}]')
    # One document's turn with the triple three times: 2 of 3 repeat.
    trajectory = SimpleNamespace(turns=[parse_triples(triples_json(list(one.triples) * 3))], complete=True)
    scores = [ConstructorEnvironment(GraphConstructorOptions(reward="carrier", **kw)).score(ep, trajectory).reward
              for kw in ({}, {"repetition_penalty": 0.0}, {"repetition_penalty": 0.5})]
    assert scores == pytest.approx([1 - 2 / 3, 1.0, 1 - 1 / 3])
    for bad in (-0.1, True, "1", float("inf"), float("nan")):
        with pytest.raises(InputError, match="repetition_penalty"):
            GraphConstructorOptions(repetition_penalty=bad)


def test_method_is_registered_with_checked_options():
    method = get_method("graph_constructor")
    assert method.inputs == ("retriever",) and "gold" in method.sft_sources
    recipe = parse_recipe({"env": "graph_constructor", "options": {"reward": "carrier", "allow_empty": True}}, "ag")
    assert recipe.options.reward == "carrier" and recipe.reward == {"task": 1.0}
    with pytest.raises(ValueError, match="reward must be one of"):
        parse_recipe({"env": "graph_constructor", "options": {"reward": "both"}}, "ag")
    with pytest.raises(ValueError, match="judge openai needs"):
        parse_recipe({"env": "graph_constructor", "options": {"judge": "openai"}}, "ag")
    env = method.make_environment(recipe, {})
    with pytest.raises(NotImplementedError, match="ConstructorRollout"):
        env.parse("[]")


def test_gold_sft_through_the_method(tiny, tmp_path):
    from ragrl.retrieval.searcher import PassageStore

    class Passages:  # the part of a Searcher the environment reads (R_C needs no search)
        passages = PassageStore(pq.read_table(tiny.root / "world/passages.parquet"))

    qa = tmp_path / "qa.parquet"
    pq.write_table(pq.read_table(tiny.root / "world/qa/train.parquet").slice(0, 6), qa)
    recipe = parse_recipe({"env": "graph_constructor", "options": {
        "reward": "carrier", "gold_triples": str(tiny.root / "world/kg/B/triples.parquet")}}, "ag")
    method = get_method("graph_constructor")
    env = method.make_environment(recipe, {"retriever": Passages()})
    stats = method.gold_sft(recipe, qa, tiny.model_dir, env, {}, tmp_path / "sft.parquet")
    rows = pq.read_table(tmp_path / "sft.parquet").to_pylist()
    assert stats["total"] == 6 and stats["kept"] == len(rows) > 0
    first = rows[0]
    assert len(first["input_ids"]) == len(first["assistant_masks"])
    trained = tiny.tok.decode([i for i, m in zip(first["input_ids"], first["assistant_masks"]) if m])
    assert trained.startswith('[{"subject": ') and trained.endswith("<|im_end|>")
    # options.system_prompt is the message the gold rows are written under (AutoGraph-R1's own).
    told = parse_recipe({"env": "graph_constructor", "options": {
        "reward": "carrier", "gold_triples": str(tiny.root / "world/kg/B/triples.parquet"),
        "system_prompt": "Triples only."}}, "ag")
    method.gold_sft(told, qa, tiny.model_dir, method.make_environment(told, {"retriever": Passages()}), {},
                    tmp_path / "told.parquet")
    texts = [r["text"] for r in pq.read_table(tmp_path / "told.parquet").to_pylist()]
    assert texts and all(t.startswith("<|im_start|>system\nTriples only.<|im_end|>") for t in texts)


# --------------------------------------------------------------------------- construct-kg


class Killed(RuntimeError):
    pass


class CountingGenerator(ScriptedGenerator):
    """Gold answers per title; raises `Killed` on the call after `die_after` calls, as a kill would
    stop the job between two batches."""

    def __init__(self, tok, script, die_after=None):
        super().__init__(tok, script)
        self.die_after = die_after

    def generate(self, *args, **kwargs):
        if self.die_after is not None and len(self.calls) >= self.die_after:
            raise Killed("killed")
        return super().generate(*args, **kwargs)


def test_construct_kg_resumes_after_a_kill_and_writes_a_servable_kg(tiny, tmp_path):
    from ragrl.kg.construct import ConstructSettings, construct_kg
    from ragrl.kg.server import KGService
    from ragrl.kg.store import load_kg

    passages = tiny.root / "world/passages.parquet"
    docs = tiny.world.passages[:10]
    by_title = {p["title"]: p["id"] for p in docs}
    script = lambda title, k: triples_json(tiny.gold.get(by_title[title], []))  # noqa: E731
    settings = ConstructSettings(batch_size=4, limit=10)
    out, work = tmp_path / "kg", tmp_path / "work"

    with pytest.raises(Killed):
        construct_kg(passages, tiny.model_dir, out, work, CountingGenerator(tiny.tok, script, die_after=2), tiny.tok,
                     settings)
    assert sorted(p.name for p in (work / "parts").iterdir()) == ["part-000000.parquet", "part-000001.parquet"]
    assert not out.exists()  # nothing half-built

    again = CountingGenerator(tiny.tok, script)
    stats = construct_kg(passages, tiny.model_dir, out, work, again, tiny.tok, settings)
    assert again.calls == [2]  # only the last batch (passages 8, 9) was generated
    assert stats["passages"] == 10 and stats["generated_now"] == 2 and stats["invalid_passages"] == 0
    built = pq.read_table(out / "triples.parquet").to_pylist()
    expected = [{"head": t.subject, "relation": t.relation, "tail": t.object, "source_id": p["id"]}
                for p in docs for t in tiny.gold.get(p["id"], [])]
    assert sorted(built, key=str) == sorted(expected, key=str) and built

    service = KGService(load_kg(out))  # what `ragrl serve-kg --kg <out>` serves
    head = built[0]["head"]
    reply = service.retrieve([{"action_type": "get_relations_out", "dataset_name": "kg", "sample_id": "x",
                               "entity_id": head, "relation": None}])[0]
    assert reply["status"] == "success" and built[0]["relation"] in reply["results"]


def test_construct_kg_starts_over_when_the_settings_change(tiny, tmp_path):
    from ragrl.kg.construct import ConstructSettings, construct_kg

    passages = tiny.root / "world/passages.parquet"
    bad = lambda title, k: "no triples here"  # noqa: E731
    out, work = tmp_path / "kg", tmp_path / "work"
    construct_kg(passages, tiny.model_dir, out, work, ScriptedGenerator(tiny.tok, bad), tiny.tok,
                 ConstructSettings(batch_size=4, limit=4))
    stats = construct_kg(passages, tiny.model_dir, out, work, ScriptedGenerator(tiny.tok, bad), tiny.tok,
                         ConstructSettings(batch_size=2, limit=4))
    assert stats["generated_now"] == 4 and stats["triples"] == 0 and stats["invalid_passages"] == 4
    assert pq.read_table(out / "triples.parquet").num_rows == 0


@pytest.mark.parametrize("change", ["passages", "endpoint"])
def test_construct_kg_starts_over_when_an_input_changes(tiny, tmp_path, change):
    """Issue #34's audit: parts generated from other passage texts, or decoded by another server,
    are not resumed (the same run again is)."""
    from ragrl.kg.construct import ConstructSettings, construct_kg

    passages = tmp_path / "passages.parquet"
    pq.write_table(pq.read_table(tiny.root / "world/passages.parquet").slice(0, 4), passages)
    script = lambda title, k: "no triples here"  # noqa: E731
    out, work, settings = tmp_path / "kg", tmp_path / "work", ConstructSettings(batch_size=2, limit=4)
    construct_kg(passages, tiny.model_dir, out, work, ScriptedGenerator(tiny.tok, script), tiny.tok, settings)
    same = construct_kg(passages, tiny.model_dir, out, work, ScriptedGenerator(tiny.tok, script), tiny.tok, settings)
    assert same["generated_now"] == 0
    endpoint = None
    if change == "passages":
        table = pq.read_table(passages).to_pylist()
        table[0]["text"] += " It was rebuilt later."
        pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(passages)), passages)
    else:
        endpoint = {"base_url": "http://127.0.0.1:8000/v1", "served_name": "constructor"}
    again = construct_kg(passages, tiny.model_dir, out, work, ScriptedGenerator(tiny.tok, script), tiny.tok,
                         settings, endpoint=endpoint)
    assert again["generated_now"] == 4


# --------------------------------------------------------------------------- the engine hook, evaluation


class _Passages:
    """The part of a Searcher the environment reads (R_C needs no search)."""

    def __init__(self, root):
        from ragrl.retrieval.searcher import PassageStore

        self.passages = PassageStore(pq.read_table(root / "world/passages.parquet"))


def _carrier_recipe(t, **options):
    return parse_recipe({"env": "graph_constructor", "rollout": {"max_turn_tokens": 400},
                         "options": {"reward": "carrier", "gold_triples": str(t.root / "world/kg/B/triples.parquet"),
                                     **options}}, "ag")


@pytest.mark.slow
def test_engine_hook_drives_constructor_episodes_for_rl_and_evaluation(tiny, monkeypatch):
    """The generic stages call `method.make_engine(...).run_rows(rows, n, seed)`; the constructor's
    engine turns QA rows into episodes, and each trajectory carries its episode for the reward."""
    from ragrl.stages.agent_rl import make_rollout_fn

    method = get_method("graph_constructor")
    recipe = _carrier_recipe(tiny)
    env = method.make_environment(recipe, {"retriever": _Passages(tiny.root)})
    engine = method.make_engine(ScriptedGenerator(tiny.tok, _gold_script(tiny)), tiny.tok, env, recipe.rollout)
    trajs = engine.run_rows(tiny.qa, n=2, seed=1)
    assert len(trajs) == 2 * len(tiny.qa) and all(t.complete for t in trajs)
    assert [t.episode.id for t in trajs[::2]] == [str(r["id"]) for r in tiny.qa]
    record = engine.record(tiny.qa[0], trajs[0])
    assert record["format"] == 1.0 and record["em"] is None and record["turns"] == 2
    assert record["generated_tokens"] == sum(trajs[0].loss_mask) > 0
    metrics = method.eval_metrics(recipe, tiny.qa[0], trajs[0])
    assert set(metrics) == set(method.eval_metric_columns) and metrics["valid"] == 1.0
    assert metrics["triples"] == float(len(trajs[0].triples())) > 0
    # R_C's task term under the deterministic judge, whatever the recipe trains with: the gold
    # graph carries the answer; the same graph without the triples naming it does not.
    assert metrics["carried"] == metrics["reward"] == 1.0
    answers = {a.lower() for a in tiny.qa[0]["golden_answers"]}
    by_title = {d.title: d.id for e in tiny.episodes for d in e.documents}
    cut = ScriptedGenerator(tiny.tok, lambda title, k: triples_json(
        [t for t in tiny.gold.get(by_title[title], []) if not {t.subject.lower(), t.object.lower()} & answers]
        or [Triple("x", "y", "z")]))
    cut_traj = method.make_engine(cut, tiny.tok, env, recipe.rollout).run_rows(tiny.qa[:1], n=1, seed=1)[0]
    cut_metrics = method.eval_metrics(recipe, tiny.qa[0], cut_traj)
    assert cut_metrics["valid"] == 1.0 and cut_metrics["carried"] == cut_metrics["reward"] == 0.0
    # R_I: the evaluation shares one PPR ranking between recall@k and the reward; the reward is
    # what the training's own score gives (recall@5 of the gold graph, minus repetition).
    index = parse_recipe({"env": "graph_constructor", "options": {"reward": "index"}}, "ag")
    scored = method.eval_metrics(index, tiny.qa[0], trajs[0])
    assert scored["reward"] == method.score(index, trajs[0], tiny.qa[0]).reward
    assert scored["reward"] == pytest.approx(scored["recall@5"] - scored["repetition"])
    assert scored["carried"] == 1.0  # R_C's term is measured under an R_I recipe too

    # The RL stage's rollout function, with the engine swapped in by the method, scores every
    # sample: the gold graph links each answer to the question's entity (connectivity judge: yes).
    class Model:  # HFGenerator wraps it; the scripted engine never calls it
        pass

    monkeypatch.setattr("ragrl.agent.generation.HFGenerator",
                        lambda model, pad, tok: ScriptedGenerator(tiny.tok, _gold_script(tiny)))
    samples = make_rollout_fn(recipe, tiny.tok, env)(tiny.qa[:2], 2, Model(), 1)
    assert len(samples) == 4 and [s.group for s in samples] == [0, 0, 1, 1]
    assert all(s.stats["reward_valid"] == 1.0 for s in samples)
    assert all(len(s.loss_mask) == len(s.response_ids) for s in samples)


def test_document_unit_gold_sft_writes_one_turn_rows_per_distinct_document(tiny, tmp_path):
    qa = tmp_path / "qa.parquet"
    pq.write_table(pq.read_table(tiny.root / "world/qa/train.parquet").slice(0, 6), qa)
    method = get_method("graph_constructor")
    recipe = _carrier_recipe(tiny, sft_unit="document")
    env = method.make_environment(recipe, {"retriever": _Passages(tiny.root)})
    stats = method.gold_sft(recipe, qa, tiny.model_dir, env, {}, tmp_path / "sft.parquet")
    rows = pq.read_table(tmp_path / "sft.parquet").to_pylist()
    distinct = {s for r in pq.read_table(qa).to_pylist() for s in r["supporting_ids"]}
    assert stats["total"] == len(distinct) and {r["id"] for r in rows} <= distinct
    assert all(r["num_turns"] == 1 for r in rows)
    with pytest.raises(ValueError, match="sft_unit"):
        _carrier_recipe(tiny, sft_unit="passage")


def test_corpus_graph_ranking_and_the_reader_retriever(tiny, tmp_path):
    """graph-rank over the world's gold KG B: every passage is a node, rankings are written best
    first and are what the reader's retriever returns, in order, whatever the query."""
    import json

    from ragrl.kg.text_graph import GraphRetriever, rank_passages
    from ragrl.retrieval.oracle import RankingRetriever
    from ragrl.stages.graph_rag import corpus_graph, graph_rank

    def embed(texts):  # bag of words hashed into 64 dims: deterministic, no model
        out = np.zeros((len(texts), 64))
        for i, text in enumerate(texts):
            for w in re.findall(r"\w+", text.lower()):
                out[i, sum(map(ord, w)) % 64] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    root = tiny.root / "world"
    graph = corpus_graph(root / "kg/B/triples.parquet", root / "passages.parquet")
    assert len(graph.passages) == pq.read_metadata(root / "passages.parquet").num_rows
    questions = [r["question"] for r in tiny.world.qa["test"][:5]]
    shared = GraphRetriever(graph, embed)
    assert [shared.rank(q).passage_ids for q in questions] == [rank_passages(graph, q, embed).passage_ids
                                                               for q in questions]
    metrics = graph_rank(root / "kg/B/triples.parquet", root / "passages.parquet", root / "qa/test.parquet",
                         tmp_path / "g", run_id="graph_gold", dataset="world_test", embed=embed, keep=3)
    assert json.loads((tmp_path / "g/metrics.json").read_text()) == metrics
    assert metrics["metrics"]["recall@5"] >= metrics["metrics"]["recall@2"] > 0
    assert metrics["graph"]["passages"] == len(graph.passages)
    ranking = pq.read_table(tmp_path / "g/ranking.parquet").to_pylist()
    assert all(len(r["passage_ids"]) <= 3 and r["scores"] == sorted(r["scores"], reverse=True) for r in ranking)

    reader = RankingRetriever(root / "passages.parquet", tmp_path / "g/ranking.parquet")
    first = ranking[0]
    hits = reader.search_for(["anything", "else"], 2, [first["id"], "no-such-question"])
    assert [h.id for h in hits[0]] == first["passage_ids"][:2] and hits[1] == []
    with pytest.raises(ValueError, match="sample ids"):
        reader.search(["q"], 2)

    bad = tmp_path / "bad.parquet"
    pq.write_table(pq.read_table(root / "kg/B/triples.parquet").slice(0, 1).set_column(
        3, "source_id", [["nowhere"]]), bad)
    with pytest.raises(ValueError, match=r"bad.parquet: source_id\(s\) \['nowhere'\]"):
        corpus_graph(bad, root / "passages.parquet")
    # A QA row whose metadata is not a JSON object: the file and the row named, nothing written.
    qa = pq.read_table(root / "qa/test.parquet").slice(0, 3).to_pylist()
    qa[2]["metadata"] = "[1, 2]"
    pq.write_table(pa.Table.from_pylist(qa), tmp_path / "qa_bad.parquet")
    with pytest.raises(ValueError, match=rf"qa_bad.parquet: QA row '{qa[2]['id']}': metadata: expected a JSON object"):
        graph_rank(root / "kg/B/triples.parquet", root / "passages.parquet", tmp_path / "qa_bad.parquet",
                   tmp_path / "g_bad", run_id="graph_gold", dataset="world_test", embed=embed, keep=3)
    assert not (tmp_path / "g_bad").exists()
    # A question without supporting passages has no recall: left out of the mean, not a 0 in it.
    qa = pq.read_table(root / "qa/test.parquet").slice(0, 4).to_pylist()
    pq.write_table(pa.Table.from_pylist(qa), tmp_path / "qa4.parquet")
    full = graph_rank(root / "kg/B/triples.parquet", root / "passages.parquet", tmp_path / "qa4.parquet",
                      tmp_path / "g4", run_id="graph_gold", dataset="world_test", embed=embed, keep=3)
    qa[3]["supporting_ids"] = []
    pq.write_table(pa.Table.from_pylist(qa), tmp_path / "qa4_nosupport.parquet")
    part = graph_rank(root / "kg/B/triples.parquet", root / "passages.parquet", tmp_path / "qa4_nosupport.parquet",
                      tmp_path / "g3", run_id="graph_gold", dataset="world_test", embed=embed, keep=3)
    first3 = graph_rank(root / "kg/B/triples.parquet", root / "passages.parquet", tmp_path / "qa4.parquet",
                        tmp_path / "g3b", run_id="graph_gold", dataset="world_test", embed=embed, keep=3,
                        max_questions=3)
    assert part["n"] == full["n"] == 4 and first3["metrics"]["recall@5"] > 0
    assert part["metrics"]["recall@5"] == pytest.approx(first3["metrics"]["recall@5"])
    for row in qa:
        row["supporting_ids"] = []
    pq.write_table(pa.Table.from_pylist(qa), tmp_path / "qa_none.parquet")
    with pytest.raises(ValueError, match="qa_none.parquet: no question has supporting_ids"):
        graph_rank(root / "kg/B/triples.parquet", root / "passages.parquet", tmp_path / "qa_none.parquet",
                   tmp_path / "g_none", run_id="graph_gold", dataset="world_test", embed=embed, keep=3)
    assert not (tmp_path / "g_none").exists()


def test_document_unit_chains_sft_turns_distinct_documents_per_row(tiny, tmp_path):
    # sft_turns 3: the same distinct documents, each once, three to a row, every answer trained
    # and every document turn masked, so the model sees later turns after its own answers.
    from ragrl.kg.constructor import gold_triples_by_passage

    qa = tmp_path / "qa.parquet"
    pq.write_table(pq.read_table(tiny.root / "world/qa/train.parquet").slice(0, 6), qa)
    method = get_method("graph_constructor")
    env_rows = {}
    for turns in (1, 3):
        recipe = _carrier_recipe(tiny, sft_unit="document", sft_turns=turns)
        env = method.make_environment(recipe, {"retriever": _Passages(tiny.root)})
        method.gold_sft(recipe, qa, tiny.model_dir, env, {}, tmp_path / f"sft{turns}.parquet")
        env_rows[turns] = pq.read_table(tmp_path / f"sft{turns}.parquet").to_pylist()
    one, three = env_rows[1], env_rows[3]
    chained = [i for r in three for i in r["id"].split("+")]
    assert sorted(chained) == sorted(r["id"] for r in one)  # the same documents, each once
    assert [r["num_turns"] for r in three] == [3] * (len(one) // 3) + ([len(one) % 3] if len(one) % 3 else [])
    gold = gold_triples_by_passage(pq.read_table(tiny.root / "world/kg/B/triples.parquet").to_pylist())
    for r in three:
        masks = r["assistant_masks"]
        spans = sum(1 for i, m in enumerate(masks) if m == 1 and (i == 0 or masks[i - 1] == 0))
        assert spans == r["num_turns"]  # one trained answer per document
        assert all(gold[i][0].subject in r["text"] for i in r["id"].split("+"))
    with pytest.raises(ValueError, match="sft_turns"):
        _carrier_recipe(tiny, sft_unit="document", sft_turns=0)


# --------------------------------------------------------------------------- the RL effect's mechanism


class _HalfBroken:
    """Each group's first sample writes the gold graph; the second writes the same for its first
    document but stops its last triple after the relation (the turn does not parse, the episode
    ends, R_I 0). Later turns only come from gold episodes."""

    def __init__(self, tok, gold_by_title):
        self.tok, self.gold = tok, gold_by_title

    def generate(self, batch_token_ids, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, *,
                 stop_token_ids=(), stop_strings=()):
        out = []
        for i, ids in enumerate(batch_token_ids):
            titles = re.findall(r"Extracts for (.*?): ", self.tok.decode(ids))
            text = triples_json(self.gold[titles[-1]])
            if len(titles) == 1 and i % 2:
                items = json.loads(text)
                del items[-1]["object"]
                text = json.dumps(items, ensure_ascii=False)
            out.append(self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id])
        return out


def _choice_margin(model, ok, cut) -> float:
    """log p(ok's token) - log p(cut's token) where the two responses first differ (after the
    last triple's relation: go on to its object, or close the item), in their shared context."""
    import torch

    d = next(i for i, (x, y) in enumerate(zip(ok.response_ids, cut.response_ids)) if x != y)
    assert ok.loss_mask[d] == cut.loss_mask[d] == 1 and ok.turn_index[d] == cut.turn_index[d] == 0
    ids = torch.tensor([ok.prompt_ids + ok.response_ids[:d]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)
    return float(logp[ok.response_ids[d]] - logp[cut.response_ids[d]])


@pytest.mark.slow
def test_grpo_on_r_i_makes_a_well_formed_graph_likelier_than_a_cut_one_on_held_out_episodes(tiny, monkeypatch,
                                                                                           tmp_path):
    """AutoGraph-R1's effect on the toy is validity: RL raises the constructor's episode recall@5
    by ending fewer turns in unparsable JSON (docs/AUTOGRAPH_R1.md, "Toy results"). The chain that
    carries it: R_I pays a graph that parses and 0 for a turn that does not, the RL stage's samples
    carry that reward on the constructor's tokens only, and the trainer's update (the default
    recipe's: loss_agg grpo, tied groups filtered, padding-free) shifts the policy from a turn that
    does not parse to one that does, on episodes whose documents it never saw. Fails if a link
    breaks (tied rewards, a mask off the constructor's tokens, an update of the wrong sign). The
    policy is the untrained tiny model and the samples are scripted, so a larger lr than the
    recipe's moves it in seconds; reward, masks and update are the RL stage's."""
    import yaml
    from transformers import AutoModelForCausalLM

    from ragrl.recipe import rl_config
    from ragrl.stages.agent_rl import make_rollout_fn
    from ragrl.train.rl import train_rl

    titles = {p["id"]: p["title"] for p in tiny.world.passages}
    gold = {titles[pid]: triples for pid, triples in tiny.gold.items() if pid in titles}
    rows = [r for r in tiny.world.qa["train"]
            if len(r["supporting_ids"]) == 2 and all(gold.get(titles[s]) for s in r["supporting_ids"])]
    train = rows[:8]
    seen = {s for r in train for s in r["supporting_ids"]}
    # A constructor's prompt is its documents, not the question: held-out means unseen documents.
    held = [r for r in rows[8:] if not seen & set(r["supporting_ids"])][:4]
    assert len(train) == 8 and len(held) >= 3, (len(train), len(held))

    monkeypatch.setattr("ragrl.methods.graph_constructor.embedder", lambda options: _bag_of_words)
    default_rl = yaml.safe_load((REPO / "config/config.yaml").read_text())["recipes"]["autograph_r1"]["rl"]
    rl = {**default_rl, "steps": 6, "lr": 1e-3, "group_size": 2, "batch_prompts": len(train), "checkpoint_every": 100}
    method = get_method("graph_constructor")
    recipe = parse_recipe({"env": "graph_constructor", "rollout": {"max_turn_tokens": 400}, "rl": rl,
                           "options": {"reward": "index", "negatives": 0, "recall_k": 2}}, "ag")
    env = method.make_environment(recipe, {"retriever": _Passages(tiny.root)})
    rollout = make_rollout_fn(recipe, tiny.tok, env, generators=lambda model, step: _HalfBroken(tiny.tok, gold))

    def margins(model_dir):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
        samples = rollout(held, 2, model, 0)
        assert [s.reward > 0 for s in samples] == [True, False] * len(held)
        return [_choice_margin(model, ok, cut) for ok, cut in zip(samples[::2], samples[1::2])]

    before = margins(tiny.model_dir)
    samples = rollout(train, 2, None, 0)
    for ok, cut in zip(samples[::2], samples[1::2]):
        assert ok.reward > 0 and cut.reward == 0  # paid only for the graph that parses
        # The loss covers the constructor's JSON; the next document, in the gold sample's response, is out.
        trained = tiny.tok.decode([t for t, m in zip(ok.response_ids, ok.loss_mask) if m])
        shown = tiny.tok.decode([t for t, m in zip(ok.response_ids, ok.loss_mask) if not m])
        assert '"subject"' in trained and "Extracts for" not in trained and "Extracts for" in shown
    after = margins(train_rl(tiny.model_dir, None, train, rollout, rl_config(recipe), tmp_path / "rl"))
    gains = [a - b for a, b in zip(after, before)]
    # Measured: +1.07 to +1.92 nats on each held-out episode; with the advantage's sign flipped
    # -0.78 to -1.49, with the loss on the document tokens instead of the constructor's -0.31 to -0.14.
    assert min(gains) > 0.5, (before, after)


def test_the_constructor_system_prompt_reaches_rollouts_sft_and_construct_kg(tiny, tmp_path):
    # AutoGraph-R1's paper config sets their DEFAULT_SYSTEM_CONTENT: the RL and evaluation episodes,
    # the gold SFT rows and the corpus-wide construction must all show the model that message.
    from ragrl.kg.construct import ConstructSettings, construct_kg
    from ragrl.kg.constructor import constructor_system_prompt
    from ragrl.methods.graph_constructor import ConstructorEngine, ConstructorEnvironment, GraphConstructorOptions

    system = "You build graphs.  \nJSON only."
    seen = []

    class Recording(ScriptedGenerator):
        def generate(self, batch_token_ids, *args, **kwargs):
            seen.extend(self.tok.decode(ids) for ids in batch_token_ids)
            return super().generate(batch_token_ids, *args, **kwargs)

    def engine(prompt):
        env = ConstructorEnvironment(GraphConstructorOptions(system_prompt=prompt))
        cfg = SimpleNamespace(seed=0, max_turn_tokens=64, max_response_tokens=512, temperature=0.0, top_p=1.0)
        return ConstructorEngine(Recording(tiny.tok, _gold_script(tiny)), tiny.tok, env, cfg)

    for prompt, want in ((system, system), (None, constructor_system_prompt())):
        seen.clear()
        engine(prompt).rollout.run(tiny.episodes[:1], n=1, seed=0)
        assert seen and all(f"<|im_start|>system\n{want}<|im_end|>" in s for s in seen)

    # construct-kg with the same message (its work-dir definition names it; without, it is as before)
    docs = {p["title"]: p["id"] for p in tiny.world.passages[:4]}
    seen.clear()
    construct_kg(tiny.root / "world/passages.parquet", tiny.model_dir, tmp_path / "kg", tmp_path / "work",
                 Recording(tiny.tok, lambda title, k: triples_json(tiny.gold.get(docs[title], []))), tiny.tok,
                 ConstructSettings(batch_size=4, limit=4, system_prompt=system))
    assert len(seen) == 4 and all(f"<|im_start|>system\n{system}<|im_end|>" in s for s in seen)
