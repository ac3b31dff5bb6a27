"""HARR's environment: every <search> goes through the retriever policy with the history-aware state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ragrl.agent.protocol import Action
from ragrl.errors import InputError
from ragrl.retrieval.query_state import (
    RETRIEVAL_INSTRUCTION,
    STATEFUL_RETRIEVAL_INSTRUCTION,
    Hop,
    history_state,
)
from ragrl.train.retriever_grpo import update
from ragrl.train.retriever_policy import recompute_log_probs
from ragrl.train.retriever_rollout import HistoryAwareSearchEnvironment, rollout_groups

from harr_helpers import one_thread  # noqa: F401  (autouse: one OpenMP thread)
from helpers import world  # noqa: F401  (fixture: a toy index, passages and policy)


def test_each_search_is_a_recorded_draw_with_the_history_aware_state(world):
    policy, index, store = world
    env = HistoryAwareSearchEnvironment(policy, index, store, topk=3, pool_size=8, alpha=0.05, seed=1)
    env.begin({"q1#0": "Who founded Velmora?", "q2#0": "Where is Ostrel?", "q1#1": "Who founded Velmora?"})
    infos = env.respond([Action("search", ("Velmora founder",)), Action("answer", answer="x"),
                         Action("search", ("founder of Velmora",))], sample_ids=["q1#0", "q2#0", "q1#1"])
    assert infos[1] is None and env.steps["q2#0"] == []
    first = env.steps["q1#0"][0]
    assert first.state == ("Instruct: " + STATEFUL_RETRIEVAL_INSTRUCTION + "\n"
                           + history_state("Who founded Velmora?", [], "Velmora founder"))
    assert len(first.pool_ids) == 8 and len(first.order) == 3
    titles = [f"T{r}" for r in first.doc_ids]
    assert infos[0] == "".join(f"Doc {i}(Title: {t}) text {t[1:]}\n" for i, t in enumerate(titles, 1))
    # The second hop of the same trajectory carries the first in its history; the other rollout's does not.
    env.respond([Action("search", ("Velmora founder birthplace",))], sample_ids=["q1#0"])
    second = env.steps["q1#0"][1]
    assert second.state.endswith(history_state("Who founded Velmora?", [Hop("Velmora founder", None)],
                                               "Velmora founder birthplace"))
    # Old log-probs are what the update recomputes.
    steps = env.steps["q1#0"] + env.steps["q1#1"]
    torch.testing.assert_close(recompute_log_probs(policy, index, steps, 0.05).detach(),
                               torch.tensor([s.old_log_prob for s in steps]), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="not started"):
        env.respond([Action("search", ("x",))], sample_ids=["q9#0"])


@pytest.mark.parametrize("hop_answer", ["think", "none"])
def test_a_hops_answer_is_the_think_of_the_turn_that_searched(world, hop_answer):
    # The authors' Search-R1 loop (generator.py): history gets {"sub_query", "answer": last <think> of
    # that turn}, appended after the hop's retrieval, so the think shows from the next hop on.
    policy, index, store = world
    env = HistoryAwareSearchEnvironment(policy, index, store, topk=2, pool_size=5, stochastic=False,
                                        template="{state}", hop_answer=hop_answer)
    env.begin({"a#0": "Where was the founder of Velmora born?"})
    first = '<think>draft</think> <think>I need the founder of "Velmora".\n</think>\n<search>Velmora founder</search>'
    env.respond([env.parse(first)], sample_ids=["a#0"])
    assert env.steps["a#0"][0].state.endswith('History: []\nQuery: Velmora founder')
    env.respond([env.parse("<search>Ana Rell birthplace</search>")], sample_ids=["a#0"])
    env.respond([env.parse("<think>last</think><search>Rell born</search>")], sample_ids=["a#0"])
    think = 'I need the founder of "Velmora".\n' if hop_answer == "think" else None
    hops = [Hop("Velmora founder", think), Hop("Ana Rell birthplace", None)]
    assert env.steps["a#0"][2].state == history_state("Where was the founder of Velmora born?", hops, "Rell born")
    if hop_answer == "think":
        assert '"answer": "I need the founder of \\"Velmora\\".\\n"' in env.steps["a#0"][1].state
    with pytest.raises(InputError, match="hop_answer"):
        HistoryAwareSearchEnvironment(policy, index, store, topk=2, pool_size=5, hop_answer="reasoning")


def test_no_history_ablation_and_deterministic_evaluation(world):
    policy, index, store = world
    env = HistoryAwareSearchEnvironment(policy, index, store, topk=2, pool_size=5, use_history=False,
                                        stochastic=False)
    env.begin({"a#0": "Q?"})
    env.respond([Action("search", ("first",))], sample_ids=["a#0"])
    env.respond([Action("search", ("second",))], sample_ids=["a#0"])
    step = env.steps["a#0"][1]
    assert step.state == f"Instruct: {RETRIEVAL_INSTRUCTION}\nQuery: second"
    assert step.order == [0, 1]  # top-k, in the index's ranking


class ScriptedEngine:
    """Stands in for the rollout engine: one search per trajectory, then answers Paris on even g."""

    def __init__(self, env):
        self.env = env

    def prompt_ids(self, question):
        return [len(question)]

    def run(self, prompts, n=1, seed=None, sample_ids=None):
        assert n == 1 and len(prompts) == len(sample_ids)
        self.env.respond([Action("search", (f"about {sid.split('#')[0]}",)) for sid in sample_ids],
                         sample_ids=sample_ids)
        return [SimpleNamespace(answer="Paris" if int(sid.split("#")[1]) % 2 == 0 else "London")
                for sid in sample_ids]


def test_rollout_groups_score_f1_and_feed_the_update(world):
    policy, index, store = world
    env = HistoryAwareSearchEnvironment(policy, index, store, topk=3, pool_size=8, seed=2)
    rows = [{"id": "q1", "question": "Capital of France?", "golden_answers": ["Paris", "paris city"]},
            {"id": "q2", "question": "Capital of England?", "golden_answers": ["London"]}]
    trajs = rollout_groups(ScriptedEngine(env), env, rows, group_size=4, seed=0)
    assert [(t.question_id, t.group, t.reward) for t in trajs] == [
        ("q1", 0, 1.0), ("q1", 0, 0.0), ("q1", 0, 1.0), ("q1", 0, 0.0),
        ("q2", 1, 0.0), ("q2", 1, 1.0), ("q2", 1, 0.0), ("q2", 1, 1.0)]
    assert all(len(t.steps) == 1 for t in trajs)
    stats = update(policy, index, torch.optim.SGD(policy.parameters(), lr=0.1), trajs, alpha=0.05)
    assert stats["updated"] == 1.0 and stats["logprob_mismatch"] < 1e-6 and stats["steps"] == 8.0


def test_a_question_twice_in_a_batch_keeps_two_sets_of_trajectories(world):
    # A step that crosses an epoch boundary can draw a question twice: each copy's G trajectories
    # keep their own history and draws, so each draw enters the update once.
    policy, index, store = world
    env = HistoryAwareSearchEnvironment(policy, index, store, topk=3, pool_size=8, seed=2)
    row = {"id": "q1", "question": "Capital of France?", "golden_answers": ["Paris"]}
    trajs = rollout_groups(ScriptedEngine(env), env, [row, row], group_size=2, seed=0)
    assert [(t.question_id, t.group) for t in trajs] == [("q1", 0), ("q1", 0), ("q1", 1), ("q1", 1)]
    assert [len(t.steps) for t in trajs] == [1, 1, 1, 1]
    assert len({id(t.steps) for t in trajs}) == 4
    stats = update(policy, index, torch.optim.SGD(policy.parameters(), lr=0.1), trajs, alpha=0.05)
    assert stats["steps"] == 4.0


class AnsweringEngine(ScriptedEngine):
    """Searches on odd g only; even g answer at once."""

    def run(self, prompts, n=1, seed=None, sample_ids=None):
        searching = [sid for sid in sample_ids if int(sid.split("#")[1]) % 2 == 1]
        self.env.respond([Action("search", ("about it",)) for _ in searching], sample_ids=searching)
        return [SimpleNamespace(answer="Paris") for _ in sample_ids]


@pytest.mark.parametrize("forced", [False, True])
def test_a_trajectory_without_a_search_gets_harrs_forced_retrieval(world, forced):
    # HARR's generator retrieves once with the question when nothing was searched: the pool's top k
    # for an empty-history state whose query is the question, trained like any step.
    policy, index, store = world
    env = HistoryAwareSearchEnvironment(policy, index, store, topk=3, pool_size=8, seed=2, forced_retrieval=forced)
    row = {"id": "q1", "question": "Capital of France?", "golden_answers": ["Paris"]}
    trajs = rollout_groups(AnsweringEngine(env), env, [row], group_size=4, seed=0)
    assert [len(t.steps) for t in trajs] == ([1, 1, 1, 1] if forced else [0, 1, 0, 1])
    if forced:
        step = trajs[0].steps[0]
        assert step.state == ("Instruct: " + STATEFUL_RETRIEVAL_INSTRUCTION + "\n"
                              + history_state("Capital of France?", [], "Capital of France?"))
        assert step.order == [0, 1, 2]  # the top k, not a draw
        torch.testing.assert_close(recompute_log_probs(policy, index, [step], 0.05).detach(),
                                   torch.tensor([step.old_log_prob]), rtol=0, atol=1e-6)
