"""The KG agent recipe (KG-R1) wired through the stages: KGQA loading, gold KG trajectories, and
RL samples carrying per-turn rewards on a tiny world, its KGs A/B and a tiny policy."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import functools
import itertools
import json
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import transformers
from replay import SegmentGenerator

from ragrl.agent.protocol import recorded_turns, shown_question
from ragrl.agent.rollout import RolloutConfig, RolloutEngine
from ragrl.data.qa import load_qa, row_golds
from ragrl.errors import DataFormatError
from ragrl.kg.store import KGStore, load_kg
from ragrl.recipe import parse_recipe
from ragrl.rewards.kg import DEFAULT_TURN_WEIGHTS, kg_rewards
from ragrl.kg.environment import KGBackendError, KGEnvironment
from ragrl.methods import get_method
from ragrl.stages.agent import load_backends
from ragrl.stages.agent_rl import make_rollout_fn
from ragrl.toy.tiny_model import build_tiny, with_prompt_text
from ragrl.toy.world import generate_world, world_text, write_world
from ragrl.train import advantages as adv_lib
from ragrl.train.kg_sft_data import gold_path, kg_gold_trajectories, plan_row, readable_names
from ragrl.train.rl import RLConfig, collate, sample_advantages

from helpers import SPEC

CFG = RolloutConfig(max_turns=5, max_turn_tokens=128, max_obs_tokens=256, max_response_tokens=2048)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("kg_agent")
    write_world(generate_world(3, 30), root / "world")
    model_dir = build_tiny(with_prompt_text(world_text(root / "world")), root / "model", SPEC)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    qa = {f"{kg}_{split}": load_qa("kgqa", root / f"world/kgqa/{kg}/{split}.parquet").to_pylist()
          for kg in "AB" for split in ("train", "test")}
    yield SimpleNamespace(root=root, model_dir=model_dir, qa=qa, tok=transformers.AutoTokenizer.from_pretrained(model_dir),
                          backend={kg: load_backends(kg=root / f"world/kg/{kg}")["graph"] for kg in "AB"},
                          store={kg: load_kg(root / f"world/kg/{kg}").store for kg in "AB"})
    torch.set_num_threads(threads)


def _engine(tiny, kg="A", generator=None, cfg=CFG):
    return RolloutEngine(generator, tiny.tok, KGEnvironment(tiny.backend[kg]), cfg)


# --------------------------------------------------------------------------- KGQA loading


def test_kgqa_loader_keeps_answer_entities_and_topics(tiny):
    row = tiny.qa["A_train"][0]
    meta = json.loads(row["metadata"])
    assert meta["answers"][0]["kb_id"].startswith("m.") and meta["answers"][0]["text"] in row["golden_answers"]
    assert meta["topic_entities"] and meta["kg"] == "A"
    # KG B asks the same questions, with its own ids.
    b = {r["id"]: r for r in tiny.qa["B_train"]}[row["id"]]
    assert b["golden_answers"] == row["golden_answers"]
    assert json.loads(b["metadata"])["answers"][0]["kb_id"].startswith("Q")


def test_kgqa_loader_reads_simple_jsonl_and_names_bad_fields(tmp_path):
    good = tmp_path / "q.jsonl"
    good.write_text(json.dumps({"id": "q1", "question": "where?", "answers": [{"kb_id": "m.1", "text": "Paris"}],
                                "entities": ["m.0"]}) + "\n")
    row = load_qa("kgqa", good).to_pylist()[0]
    assert row["golden_answers"] == ["Paris"] and json.loads(row["metadata"])["topic_entities"] == ["m.0"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "where?", "answers": [{"kb_id": "", "text": " "}]}) + "\n")
    with pytest.raises(DataFormatError, match=r"bad.jsonl:1: field 'answers\[0\]'"):
        load_qa("kgqa", bad)


# --------------------------------------------------------------------------- gold paths


def test_gold_path_is_the_shortest_outgoing_chain():
    store = KGStore.from_triples(["a", "a", "b", "c", "a"], ["r1", "r2", "r3", "r4", "r9"], ["b", "c", "d", "d", "e"])
    assert gold_path(store, "a", ["d"]) == (("a", "r1", "b"), ("b", "r3", "d"))  # r1 < r2: first in id order
    assert gold_path(store, "a", ["e"]) == (("a", "r9", "e"),)
    assert gold_path(store, "a", ["d"], max_hops=1) is None
    assert gold_path(store, "nobody", ["d"]) is None
    assert gold_path(store, "a", [{"text": "zzz", "kb_id": "d"}]) is not None  # kb_id alone finds it


@pytest.mark.parametrize("restate", [False, True])
def test_gold_kg_trajectories_are_what_the_engine_produces_and_earn_full_reward(tiny, restate):
    rows = tiny.qa["A_train"][:24]
    gold, stats = kg_gold_trajectories(rows, _engine(tiny), tiny.store["A"], restate_question=restate)
    assert stats.total == 24 and stats.kept == len(gold) >= 20, stats.to_dict()
    hops = {len(plan_row(r, tiny.store["A"]).path) for r in rows}
    assert hops == {1, 2}

    # Replaying the gold assistant segments through the rollout engine reproduces every token and
    # the loss mask: SFT and RL see one format.
    by_id = {r["id"]: r for r in rows}
    trajs = _engine(tiny, generator=SegmentGenerator(gold)).run_questions(
        [by_id[g["id"]]["question"] for g in gold], n=1)
    eos = tiny.tok.eos_token_id
    for g, t in zip(gold, trajs):
        assert g["input_ids"][:-1] == t.prompt_ids + t.response_ids and g["input_ids"][-1] == eos
        assert g["assistant_masks"][len(t.prompt_ids):-1] == t.loss_mask
        assert t.stop_reason == "answer" and t.num_searches == g["num_turns"] - 1  # every query turn, then the answer
        # A perfect trajectory earns every KG-R1 reward.
        r = kg_rewards(recorded_turns(t), row_golds(by_id[g["id"]]), t.answer, DEFAULT_TURN_WEIGHTS,
                       {"f1": 1, "retrieval": 1})
        assert r.global_components["f1"] == 1.0 and r.global_components["retrieval"] == 1.0, t.response_text
        assert all(c == {"format": 1.0, "query": 1.0, "answer": 0.0} for c in r.turn_components[:-1])
        assert r.turn_components[-1] == {"format": 1.0, "query": 0.0, "answer": 1.0}


def test_gold_trajectories_drop_rows_that_would_not_fit(tiny):
    rows = tiny.qa["A_train"][:24]
    store = tiny.store["A"]
    # Three tool turns cannot hold a two-hop plan (four queries) before the answer.
    _, stats = kg_gold_trajectories(rows, _engine(tiny, cfg=RolloutConfig(**{**CFG.__dict__, "max_turns": 3})), store)
    assert stats.dropped["too_many_turns"] > 0 and stats.kept + sum(stats.dropped.values()) == 24
    # Four tool turns hold its four queries, but then the answer turn is the engine's forced one
    # (turn 4 of 0..3): those rows go too. Five hold the plan and a free answer turn.
    plans = [plan_row(r, store) for r in rows]
    two_hop = sum(1 for p in plans if not isinstance(p, str) and len(p.path) == 2)
    assert two_hop > 0
    for max_turns, dropped in ((4, two_hop), (5, 0)):
        _, stats = kg_gold_trajectories(
            rows, _engine(tiny, cfg=RolloutConfig(**{**CFG.__dict__, "max_turns": max_turns})), store)
        assert stats.dropped["too_many_turns"] == dropped, (max_turns, stats.to_dict())


def test_readable_relation_names_and_their_collisions():
    names = ["people.person.place_of_birth", "film.film.country", "location.location.country", "employer",
             "book.written_work.author", "x.employer"]
    # Two relations that would both read "country" keep their names, and so does one whose
    # readable form is another relation's real name.
    assert readable_names(names) == {"people.person.place_of_birth": "place of birth", "book.written_work.author": "author"}


def test_readable_share_renames_whole_trajectories_but_queries_the_real_kg(tiny):
    rows = tiny.qa["A_train"][:24]
    store = tiny.store["A"]
    plain, _ = kg_gold_trajectories(rows, _engine(tiny), store)
    readable, stats = kg_gold_trajectories(rows, _engine(tiny), store, readable_share=1.0)
    # The same rows survive: the calls reached KG A under the real names and found the answers.
    assert [g["id"] for g in readable] == [g["id"] for g in plain] and stats.kept == len(plain)
    dotted = [n for n in store.relation_names if "." in n]
    for g in readable:
        text = g["text"].split("<|im_start|>assistant", 1)[1]
        assert not any(n in text for n in dotted), text  # listings, calls and thoughts alike
        assert "get_entities_out(" in text
    births = [g["text"] for g in readable if "place of birth" in g["text"]]
    assert births and any('" place of birth")' in t for t in births)
    # A share renames a reproducible subset of the rows.
    half, _ = kg_gold_trajectories(rows, _engine(tiny), store, readable_share=0.5)
    again, _ = kg_gold_trajectories(rows, _engine(tiny), store, readable_share=0.5)
    renamed = [g["id"] for g in half if not any(n in g["text"].split("assistant", 1)[1] for n in dotted)]
    assert 0 < len(renamed) < len(half) and [g["text"] for g in half] == [g["text"] for g in again]
    with pytest.raises(ValueError, match="readable_share"):
        kg_gold_trajectories(rows, _engine(tiny), store, readable_share=1.5)


def test_readable_copies_keep_every_plain_row_and_add_the_renamed_ones(tiny):
    rows = tiny.qa["A_train"][:24]
    store = tiny.store["A"]
    plain, _ = kg_gold_trajectories(rows, _engine(tiny), store)
    replaced, _ = kg_gold_trajectories(rows, _engine(tiny), store, readable_share=0.5)
    both, stats = kg_gold_trajectories(rows, _engine(tiny), store, readable_share=0.5, readable_copies=True)
    by_id = {g["id"]: g["text"] for g in both}
    # Every plain row is there unchanged; each renamed row of the replacing mode is added under
    # its own id, so the training KG's spelling is seen for every question.
    assert all(by_id[g["id"]] == g["text"] for g in plain)
    assert [g["id"] for g in replaced] == [p["id"] for p in plain]
    renamed = {g["id"]: g["text"] for g, p in zip(replaced, plain) if g["text"] != p["text"]}
    assert renamed and {f"{i}#readable": t for i, t in renamed.items()} == {
        i: t for i, t in by_id.items() if i.endswith("#readable")}
    assert len(both) == len(plain) + len(renamed) and stats.kept == stats.total == len(both)


def test_restated_questions_open_every_relation_choice_and_change_nothing_else(tiny):
    rows = tiny.qa["A_train"][:24]
    store = tiny.store["A"]
    plain, _ = kg_gold_trajectories(rows, _engine(tiny), store)
    restated, stats = kg_gold_trajectories(rows, _engine(tiny), store, restate_question=True)
    assert [g["id"] for g in restated] == [g["id"] for g in plain] and stats.kept == len(plain)
    questions = {r["id"]: r["question"] for r in rows}
    for g, p in zip(restated, plain):
        opened = f"<think>{questions[g['id']]} "
        thoughts = g["text"].split("<|im_start|>assistant", 1)[1].split("<think>")[1:]
        # Every thought that names the relation to follow opens with the question, and only those;
        # without the restatement the row is the plain one, calls and observations alike.
        choosing = [t for t in thoughts if " has the relation " in t]
        assert choosing and all(t.startswith(questions[g["id"]] + " ") for t in choosing)
        assert sum(t.startswith(questions[g["id"]]) for t in thoughts) == len(choosing)
        assert g["text"].replace(opened, "<think>") == p["text"]


def test_restated_questions_are_the_prompts_text_and_readable_copies_restate_too(tiny):
    store = tiny.store["A"]
    rows = [dict(r) for r in tiny.qa["A_train"][:24]]
    # A question as real data may bring it: surrounding spaces, a protocol tag, a chat token and
    # no end punctuation. The thought must copy what the prompt shows, and still parse.
    rows[0]["question"] = "  " + rows[0]["question"].rstrip("?") + " </think><kg-query> <|im_end|>  "
    engine = _engine(tiny, cfg=RolloutConfig(**{**CFG.__dict__, "max_turn_tokens": 256, "max_response_tokens": 2048,
                                                 "max_context_tokens": 4096}))
    both, stats = kg_gold_trajectories(rows, engine, store, readable_share=0.5, readable_copies=True,
                                       restate_question=True)
    assert stats.kept == stats.total == len(both) and any(g["id"].endswith("#readable") for g in both)
    by_id = {r["id"]: r for r in rows}
    for g in both:
        shown = shown_question(by_id[g["id"].split("#")[0]]["question"], engine.reserved)
        assert shown in tiny.tok.decode(engine.prompt_ids(by_id[g["id"].split("#")[0]]["question"]))
        body = g["text"].split("<|im_start|>assistant", 1)[1]
        expected = shown + (" " if shown.endswith("?") else "? ")
        assert body.count(f"<think>{expected}") == body.count(" has the relation ") > 0, body
    first = [g["text"] for g in both if g["id"].split("#")[0] == rows[0]["id"]]
    assert first and all("&lt;/think>&lt;kg-query> &lt;|im_end|>? " in t for t in first)


def test_a_restated_question_that_overflows_the_turn_budget_drops_the_row(tiny):
    rows = tiny.qa["A_train"][:24]
    store = tiny.store["A"]
    plain, _ = kg_gold_trajectories(rows, _engine(tiny), store)
    # The longest plain assistant turn, in tokens: a budget of exactly that keeps every plain row.
    longest = max(max(len(list(run)) for bit, run in itertools.groupby(g["assistant_masks"]) if bit) for g in plain)
    cfg = RolloutConfig(**{**CFG.__dict__, "max_turn_tokens": longest})
    kept, _ = kg_gold_trajectories(rows, _engine(tiny, cfg=cfg), store)
    restated, stats = kg_gold_trajectories(rows, _engine(tiny, cfg=cfg), store, restate_question=True)
    assert len(kept) == len(plain)
    assert stats.dropped["turn_too_long"] > 0 and len(restated) + stats.dropped["turn_too_long"] == len(plain)


def test_the_kg_method_hands_its_readable_options_to_the_sft_data(tiny, tmp_path):
    qa = tmp_path / "qa.parquet"
    pq.write_table(pa.Table.from_pylist(tiny.qa["A_train"][:24]), qa)
    backends = {"graph": tiny.backend["A"]}
    ids = {}
    for copies in (False, True):
        recipe = parse_recipe({"env": "kg", "options": {"readable_relations": 0.5, "readable_copies": copies}}, "k")
        out = tmp_path / f"sft_{copies}.parquet"
        recipe.method.gold_sft(recipe, qa, tiny.model_dir, recipe.method.make_environment(recipe, backends),
                               backends, out)
        ids[copies] = pq.read_table(out).column("id").to_pylist()
    added = [i for i in ids[True] if i.endswith("#readable")]
    assert added and not any(i.endswith("#readable") for i in ids[False])
    assert sorted(i for i in ids[True] if i not in added) == sorted(ids[False])
    recipe = parse_recipe({"env": "kg", "options": {"restate_question": True}}, "k")
    out = tmp_path / "sft_restated.parquet"
    recipe.method.gold_sft(recipe, qa, tiny.model_dir, recipe.method.make_environment(recipe, backends), backends, out)
    rows = pq.read_table(out).to_pylist()
    questions = {r["id"]: r["question"] for r in tiny.qa["A_train"][:24]}
    assert rows and all(f"<think>{questions[r['id']]} " in r["text"] for r in rows)


# --------------------------------------------------------------------------- RL samples


def test_rollout_fn_attaches_turn_rewards_aligned_with_the_turn_index(tiny):
    recipe = parse_recipe({"env": "kg", "rollout": {**CFG.__dict__, "max_turn_tokens": 24},
                           "turn_reward": {"format": 0.15, "query": 0.1, "answer": 0.1},
                           "reward": {"f1": 0.3, "retrieval": 0.4}}, "kg_r1")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32)
    rollout_fn = make_rollout_fn(recipe, tiny.tok, KGEnvironment(tiny.backend["A"]))
    prompts = tiny.qa["A_train"][:2]
    samples = rollout_fn(prompts, 3, model, 1)
    assert len(samples) == 6 and sorted({s.group for s in samples}) == [0, 1]
    with_turns = [s for s in samples if s.turn_rewards is not None]
    assert with_turns, "no sample kept its turn rewards"
    for s in with_turns:
        assert len(s.turn_rewards) == max(s.turn_index) + 1
        assert all(0.0 <= r <= 0.35 + 1e-9 for r in s.turn_rewards)
        assert 0.0 <= s.reward <= 0.7 + 1e-9 and "reward_f1" in s.stats and "reward_turn_mean" in s.stats

    # The trainer's advantages: A = w * A_turn + A_global on policy tokens, 0 on observations.
    cfg = RLConfig(group_size=3, batch_prompts=2, turn_advantage_weight=0.5)
    batch = collate(samples, tiny.tok.pad_token_id)
    adv = sample_advantages(samples, batch, cfg, 0.0, 1.0)
    seq = adv_lib.group_advantages([s.reward for s in samples], [s.group for s in samples])
    turn = adv_lib.turn_advantages([s.turn_rewards for s in samples], [s.group for s in samples])
    for i, s in enumerate(samples):
        n = len(s.response_ids)
        mask = np.array(s.loss_mask, dtype=bool)
        assert torch.all(adv[i, :n][~torch.from_numpy(mask)] == 0)
        for k in np.flatnonzero(mask)[:50]:
            t = s.turn_index[k]
            expected = float(seq[i]) + (0.5 * turn[i][t] if turn[i] and t < len(turn[i]) else 0.0)
            assert adv[i, k].item() == pytest.approx(expected, abs=1e-5)


def test_the_same_policy_transfers_by_swapping_only_the_kg(tiny):
    """KG B has other relation names; the environment built on it answers the same calls in B's
    vocabulary, and gold KG-A relation names are unknown there (so the agent must list relations)."""
    a, b = tiny.store["A"], tiny.store["B"]
    row = next(r for r in tiny.qa["A_train"] if len(plan_row(r, a).path) == 1)
    (head, rel_a, tail), = plan_row(row, a).path
    (head_b, rel_b, tail_b), = plan_row({**row, "metadata": {**json.loads(row["metadata"]), "answers": [
        {"text": tail, "kb_id": None}]}}, b).path
    assert (head_b, tail_b) == (head, tail) and rel_b != rel_a
    env_b = KGEnvironment(tiny.backend["B"])
    obs = env_b.respond([env_b.parse(f'<kg-query>get_entities_out("{head}", "{rel_a}")</kg-query>')])[0]
    assert obs.startswith("Relation not found") and rel_b in obs


def test_subgraph_mode_serves_each_trajectory_its_own_question(tiny):
    """KG-R1 restricts each question to its subgraph: the engine passes each trajectory's question
    id to the environment, so gold trajectories and evaluation work unchanged in subgraph mode."""
    store = tiny.store["A"]
    sub = load_backends(kg=tiny.root / "world/kg/A", kg_mode="subgraph")["graph"]
    rows = tiny.qa["A_train"][:12]
    gold_whole, _ = kg_gold_trajectories(rows, _engine(tiny), store)
    engine = RolloutEngine(None, tiny.tok, KGEnvironment(sub), CFG)
    gold_sub, stats = kg_gold_trajectories(rows, engine, store)
    assert stats.kept == len(gold_whole) > 0
    # Same calls, answered from 2-hop neighbourhoods: relation listings can only shrink.
    assert all(len(s["input_ids"]) <= len(w["input_ids"]) for s, w in zip(gold_sub, gold_whole))
    by_id = {r["id"]: r for r in rows}
    trajs = RolloutEngine(SegmentGenerator(gold_sub), tiny.tok, KGEnvironment(sub), CFG).run_questions(
        [by_id[g["id"]]["question"] for g in gold_sub], n=1, sample_ids=[g["id"] for g in gold_sub])
    assert [t.prompt_ids + t.response_ids for t in trajs] == [g["input_ids"][:-1] for g in gold_sub]
    # Readable copies ask the KG under their question's id, not their own row id.
    copies, stats = kg_gold_trajectories(rows, engine, store, readable_share=0.5, readable_copies=True)
    assert stats.kept == stats.total > len(gold_sub) and any(g["id"].endswith("#readable") for g in copies)
    # Without its question id a subgraph-mode call is a pipeline error, not an observation.
    with pytest.raises(KGBackendError, match=r"no subgraph for sample_id None"):
        RolloutEngine(SegmentGenerator(gold_sub), tiny.tok, KGEnvironment(sub), CFG).run_questions(
            [by_id[gold_sub[0]["id"]]["question"]], n=1)


def test_evaluation_reports_kg_r1_entity_metrics(tiny, tmp_path):
    """A KG evaluation adds Hits@1, entity F1 and retrieval hit per question and in metrics.json;
    a policy replaying gold trajectories scores 1 on all, on the stage's own evaluate()."""
    from ragrl.data.qa import write_qa

    rows = tiny.qa["A_test"][:6]
    gold, _ = kg_gold_trajectories(rows, _engine(tiny), tiny.store["A"])
    import pyarrow.compute as pc

    from ragrl.eval.evaluate import evaluate

    kept = [g["id"] for g in gold]
    qa = tmp_path / "qa.parquet"
    write_qa("kgqa", tiny.root / "world/kgqa/A/test.parquet", qa)
    table = pq.read_table(qa)
    pq.write_table(table.filter(pc.is_in(table["id"], value_set=pa.array(kept))), qa)  # replayable rows only
    kg = get_method("kg")
    metrics = evaluate(None, qa, KGEnvironment(tiny.backend["A"]), tmp_path / "out", run_id="gold", dataset="A_test",
                       rollout_cfg=CFG, generator=SegmentGenerator(gold), tokenizer=tiny.tok,
                       extra_metrics=functools.partial(kg.eval_metrics, None), extra_columns=kg.eval_metric_columns)
    preds = pq.read_table(tmp_path / "out/predictions.parquet").to_pylist()
    assert len(preds) == len(kept) >= 4
    assert all(p["hits1"] == p["entity_f1"] == p["retrieval_hit"] == p["em"] == 1.0 and p["queries"] for p in preds)
    assert {k: metrics["metrics"][k] for k in ("hits1", "entity_f1", "retrieval_hit")} == dict.fromkeys(
        ("hits1", "entity_f1", "retrieval_hit"), 1.0)
