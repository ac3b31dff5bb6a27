"""RAG-R1: several queries in one `<search>` turn, retrieved in one batch; otherwise Search-R1.

The environment (`MultiQuerySearchEnvironment`) takes up to `max_queries` queries per turn; the
reward, the gold plans (a comparison's two lookups become one parallel turn) and the SFT and RL
routes are the search method's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ragrl.errors import InputError
from ragrl.methods import Method
from ragrl.methods import search


@dataclass(frozen=True)
class MultiQueryOptions:
    # How queries are separated and observations laid out: "ragrl" (`q1 | q2`, documents grouped
    # per query) or "rag_r1" (RAG-R1's own: `q1, q2`, JSON with `query` and `documents`, its prompt).
    query_format: str = "ragrl"
    # RAG-R1 cuts each query's documents to max_obs_length tokens and leaves the JSON as a whole
    # uncut; null: the rollout's max_obs_tokens cuts the whole observation. JSON layout only.
    query_obs_tokens: int | None = None

    def __post_init__(self) -> None:
        from ragrl.agent.environments import MULTI_QUERY_FORMATS

        if self.query_format not in MULTI_QUERY_FORMATS:
            raise InputError(f"query_format {self.query_format!r} is not one of {sorted(MULTI_QUERY_FORMATS)}")
        if self.query_obs_tokens is not None:
            if isinstance(self.query_obs_tokens, bool) or not isinstance(self.query_obs_tokens, int) \
                    or self.query_obs_tokens < 1:
                raise InputError(f"query_obs_tokens must be a positive integer, got {self.query_obs_tokens!r}")
            if MULTI_QUERY_FORMATS[self.query_format].observation != "json":
                raise InputError(f"query_obs_tokens cuts the documents of RAG-R1's JSON observation: it needs "
                                 f"query_format 'rag_r1', not {self.query_format!r}")


def make_environment(recipe, backends: Mapping[str, Any]):
    from ragrl.agent.environments import MultiQuerySearchEnvironment

    options = recipe.options if recipe.options is not None else MultiQueryOptions()
    return MultiQuerySearchEnvironment(search.retriever_of(backends), recipe.topk, recipe.max_queries,
                                       query_format=options.query_format, query_obs_tokens=options.query_obs_tokens)


METHOD = Method(
    name="multi_query_search",
    summary="RAG-R1: up to max_queries parallel queries per search turn",
    make_environment=make_environment,
    score=search.score,
    inputs=("retriever",),
    reward_keys=search.REWARD_KEYS,
    turn_reward_keys=search.TURN_REWARD_KEYS,
    default_reward={"em": 1.0},
    options=MultiQueryOptions,
    gold_sft=search.gold_sft,
    gold_sft_reason=search.world_gold_reason,
    verl_reward=search.verl_reward,
    rl_backends=("local", "verl"),
    baselines=True,
    row_columns=search.METHOD.row_columns,
    eval_metrics=search.eval_metrics,
    eval_metric_columns=search.METHOD.eval_metric_columns,
)
