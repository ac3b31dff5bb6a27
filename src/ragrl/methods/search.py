"""Search-R1: one `<search>query</search>` per turn against a passage retriever, answer reward.

Environment: `ragrl.agent.environments.SearchEnvironment` over the recipe's retriever (an
in-process searcher or the HTTP service). Reward: a weighted sum of answer EM / F1 / cover-EM and
the format reward (Search-R1 trains on EM alone). Cold-start SFT: gold trajectories on the
synthetic world, a teacher, or an imported file. RL: the local trainer or verl.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ragrl.errors import InputError
from ragrl.methods import Method, Score, token_turns

REWARD_KEYS = ("em", "f1", "cover_em", "format", "retrieval")
# Per-turn reward (`turn_reward: {retrieval: w}` with `rl.turn_advantage_weight`): each turn's share
# of the supporting passages it showed first, read from the turn record (local RL only).
TURN_REWARD_KEYS = ("retrieval",)
# Keys scored from the QA row's supporting passages as well as the trajectory: local RL only
# (verl's reward function gets the trajectory and the golden answers).
ROW_REWARD_KEYS = ("retrieval",)


def retriever_of(backends: Mapping[str, Any]):
    """The environments take hits as mappings; the searcher and the HTTP client return `Hit`s."""
    from ragrl.agent.retriever_adapter import AgentRetriever

    backend = backends.get("retriever")
    return None if backend is None else AgentRetriever(backend)


def make_environment(recipe, backends: Mapping[str, Any]):
    from ragrl.agent.environments import SearchEnvironment

    return SearchEnvironment(retriever_of(backends), recipe.topk)


def answer_score(recipe, trajectory, row: Mapping[str, Any], tools: Sequence[str] = ("search",)) -> Score:
    """The recipe's weighted answer metrics; every metric it weighs is logged on its own."""
    from ragrl.rewards.qa import composite_reward

    golds = row["golden_answers"]
    parts = {k: retrieval_reward(trajectory, row) if k == "retrieval" else composite_reward(trajectory, golds,
                                                                                             {k: 1.0}, tools)
             for k in recipe.reward}
    return Score(sum(float(w) * parts[k] for k, w in recipe.reward.items()), turn_rewards(recipe, trajectory, row),
                 parts)


def _supporting(row: Mapping[str, Any]) -> list:
    supporting = row.get("supporting_ids")
    if supporting is None or len(supporting) == 0:
        raise InputError(f"QA row {row.get('id')!r}: reward 'retrieval' needs the row's supporting_ids "
                         "(the passages that answer it); this dataset has none for it")
    return list(supporting)


def retrieval_reward(trajectory, row: Mapping[str, Any]) -> float:
    """Recall of the row's supporting passages among those the episode's searches showed."""
    from ragrl.agent.protocol import recorded_turns
    from ragrl.rewards.qa import support_recall

    return support_recall(recorded_turns(trajectory), _supporting(row))


def turn_rewards(recipe, trajectory, row: Mapping[str, Any]) -> list[float] | None:
    """The recipe's per-turn reward, one value per generation call that produced tokens (the
    rollout's turn index), or None when the recipe weighs none."""
    from ragrl.agent.protocol import recorded_turns
    from ragrl.rewards.qa import support_gains

    weight = float(recipe.turn_reward.get("retrieval", 0.0)) if recipe.turn_reward else 0.0
    if not weight:
        return None
    return [weight * g for g in token_turns(support_gains(recorded_turns(trajectory), _supporting(row)), trajectory)]


def score(recipe, trajectory, row: Mapping[str, Any]) -> Score:
    return answer_score(recipe, trajectory, row, ("search",))


def verl_reward(weights: Mapping[str, float], trajectory: Mapping[str, Any], golds: Sequence[str],
                tools: Sequence[str] = ("search",)) -> dict:
    """verl's reward: the trajectory our agent loop recorded (its answer and turn record), scored
    like a local rollout, every metric logged."""
    from ragrl.rewards.qa import composite_reward

    row_keys = sorted(k for k in ROW_REWARD_KEYS if weights.get(k))
    if row_keys:
        raise InputError(f"reward {row_keys} needs each question's supporting passages, which verl's reward "
                         "function does not get; train with rl.backend: local")
    parts = {key: composite_reward(trajectory, golds, {key: 1.0}, tools) for key in REWARD_KEYS
             if key not in ROW_REWARD_KEYS}
    weights = {k: w for k, w in weights.items() if k not in ROW_REWARD_KEYS}
    return {"score": float(composite_reward(trajectory, golds, weights, tools)), **parts}


def eval_metrics(recipe, row: Mapping[str, Any], trajectory) -> dict[str, float | None]:
    """`distinct_per_search`: the distinct queries of the executed searches per search (RAG-R1's
    parallel queries: one search of "A? | B?" counts 2, a query repeated in a later search once);
    None without a search, so the mean is over the questions that searched. In the database per
    question type, so "world_test:comparison" holds issue #35's RAG-R1 bar."""
    searches = [a for a in trajectory.actions if a["type"] == "search" and a["valid"]]
    if not searches:
        return {"distinct_per_search": None}
    return {"distinct_per_search": len({q for a in searches for q in a["queries"]}) / len(searches)}


def world_gold_reason(dataset: Mapping[str, Any]) -> str | None:
    """Gold plans need the synthetic world's hop annotations: only its QA splits have them."""
    if dataset.get("format") == "parquet" and str(dataset.get("path", "")).startswith("results/world/qa/"):
        return None
    return (f"gold trajectories need the synthetic world's hop annotations, and dataset {dataset.get('path')!r} "
            f"(format {dataset.get('format')}) has none")


def gold_sft(recipe, qa, policy, env, backends, out, limit=None) -> dict:
    from ragrl.toy.gold import WorldPlanner
    from ragrl.train.sft_data import gold_sft_stage

    # Parallel queries are written with the environment's own separator, so they split back as planned.
    from ragrl.agent.protocol import query_joiner

    joiner = query_joiner(getattr(env, "separators", ("|",))[0])
    return gold_sft_stage(qa, policy, env, WorldPlanner(recipe.seed, joiner), out, rollout_cfg=recipe.rollout,
                          limit=limit)


METHOD = Method(
    name="search",
    summary="Search-R1: one search query per turn, answer-EM reward",
    make_environment=make_environment,
    score=score,
    inputs=("retriever",),
    reward_keys=REWARD_KEYS,
    turn_reward_keys=TURN_REWARD_KEYS,
    default_reward={"em": 1.0},
    gold_sft=gold_sft,
    gold_sft_reason=world_gold_reason,
    verl_reward=verl_reward,
    rl_backends=("local", "verl"),
    baselines=True,
    row_columns=("supporting_ids",),
    eval_metrics=eval_metrics,
    eval_metric_columns=("distinct_per_search",),
)
