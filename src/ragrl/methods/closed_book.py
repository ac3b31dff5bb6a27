"""The closed-book baseline (`env: none`): the policy answers directly, with no tool at all.

It is the `no_retrieval` row of the tables: on invented names nothing can be known without
retrieval, so it bounds every retrieval method from below. The prompt asks for a direct answer
(think, then <answer>, no mention of search) and the run has no tool turns, so the first turn is
the engine's final answer turn; a search written there is not executed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ragrl.methods import Method
from ragrl.methods import search

NO_SEARCH_INSTRUCTION = (
    "Answer the given question. Reason step by step inside <think> and </think>, then give the "
    "final answer inside <answer> and </answer>, without explanation, for example "
    "<answer> Beijing </answer>. Question: {question}\n"
)


def make_environment(recipe, backends: Mapping[str, Any]):
    from ragrl.agent.environments import ClosedBookEnvironment

    return ClosedBookEnvironment()


def eval_rollout(cfg):
    instruction = cfg.instruction if cfg.instruction is not None else NO_SEARCH_INSTRUCTION
    return dataclasses.replace(cfg, max_turns=0, instruction=instruction)


def score(recipe, trajectory, row: Mapping[str, Any]):
    return search.answer_score(recipe, trajectory, row, ())


METHOD = Method(
    name="none",
    summary="closed book: answer directly, no retrieval (the no_retrieval baseline)",
    make_environment=make_environment,
    score=score,
    # nothing is retrieved without a search
    reward_keys=tuple(k for k in search.REWARD_KEYS if k not in search.ROW_REWARD_KEYS),
    default_reward={"em": 1.0},
    eval_rollout=eval_rollout,
    sft_data=False,  # a baseline of the untrained policy: nothing to fine-tune
)
