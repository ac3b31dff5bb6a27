"""RAG-R1: several queries in one `<search>` turn, retrieved in one batch; otherwise Search-R1.

The environment (`MultiQuerySearchEnvironment`) takes up to `max_queries` queries per turn; the
reward, the gold plans (a comparison's two lookups become one parallel turn) and the SFT and RL
routes are the search method's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ragrl.methods import Method
from ragrl.methods import search


def make_environment(recipe, backends: Mapping[str, Any]):
    from ragrl.agent.environments import MultiQuerySearchEnvironment

    return MultiQuerySearchEnvironment(search.retriever_of(backends), recipe.topk, recipe.max_queries)


METHOD = Method(
    name="multi_query_search",
    summary="RAG-R1: up to max_queries parallel queries per search turn",
    make_environment=make_environment,
    score=search.score,
    inputs=("retriever",),
    reward_keys=search.REWARD_KEYS,
    default_reward={"em": 1.0},
    gold_sft=search.gold_sft,
    gold_sft_reason=search.world_gold_reason,
    text_reward=search.text_reward,
    rl_backends=("local", "verl"),
    baselines=True,
)
