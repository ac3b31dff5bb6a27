"""KG-R1: an agent querying a knowledge graph with four one-hop operations, turn-level rewards.

Environment: `ragrl.kg.environment.KGEnvironment` over the KG its dataset names (in-process
`KGService`, or a running `ragrl serve-kg` by URL). Rewards: KG-R1's per-turn format / new valid
query / answer rewards and global entity F1 / Hits@1 / retrieval hit / format
(`ragrl.rewards.kg`), trained with turn-level advantages (`rl.turn_advantage_weight`).
Evaluation adds KG-R1's metrics per prediction. Cold-start SFT: gold KG paths found in the KG.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ragrl.errors import InputError
from ragrl.methods import Method, Score, token_turns

REWARD_KEYS = ("f1", "hits1", "retrieval", "format")
TURN_REWARD_KEYS = ("format", "query", "answer")
EVAL_COLUMNS = ("hits1", "entity_f1", "retrieval_hit")


@dataclass(frozen=True)
class KGOptions:
    max_hops: int = 2  # longest gold path the SFT planner looks for
    # Share of SFT trajectories that show relations by readable names (`place of birth` for
    # `people.person.place_of_birth`), so the policy learns to read a listing, not recall a spelling.
    readable_relations: float = 0.0
    # True: those trajectories are added in readable form beside their plain form, instead of
    # replacing it, so the training KG's own spelling keeps every row.
    readable_copies: bool = False
    # True: the SFT thought that picks a relation opens with the question, so a small policy reads
    # the words that decide the relation right before writing it (ragrl.train.kg_sft_data).
    restate_question: bool = False

    def __post_init__(self) -> None:
        if self.max_hops < 1:
            raise InputError(f"max_hops={self.max_hops} must be >= 1")
        if not 0.0 <= self.readable_relations <= 1.0:
            raise InputError(f"readable_relations={self.readable_relations} must be in [0, 1]")


def make_environment(recipe, backends: Mapping[str, Any]):
    from ragrl.kg.environment import KGEnvironment

    backend = backends.get("graph")
    if backend is None:
        raise InputError(f"recipe {recipe.name!r} (env kg) needs a KG: --kg DIR or --kg-url URL")
    return KGEnvironment(backend)


def score(recipe, trajectory, row: Mapping[str, Any]) -> Score:
    """A global reward per trajectory and one reward per assistant turn, read from the engine's
    turn record (one record per generation call, so aligned with its per-token turn index)."""
    from ragrl.agent.protocol import recorded_turns
    from ragrl.data.qa import row_golds
    from ragrl.rewards.kg import DEFAULT_TURN_WEIGHTS, kg_rewards

    r = kg_rewards(recorded_turns(trajectory), row_golds(row), trajectory.answer,
                   recipe.turn_reward or DEFAULT_TURN_WEIGHTS, recipe.reward)
    turn_rewards = token_turns(r.turn_rewards, trajectory)
    mean_turn = sum(turn_rewards) / len(turn_rewards) if turn_rewards else 0.0
    return Score(r.global_reward, turn_rewards, {"turn_mean": mean_turn, **r.global_components})


def eval_metrics(recipe, row: dict, trajectory) -> dict[str, float]:
    """KG-R1's entity metrics: Hits@1, F1 over answer entities (a name and its KB id count once),
    and whether a gold answer appeared in any observation the environment returned."""
    from ragrl.agent.protocol import recorded_turns
    from ragrl.data.qa import row_golds
    from ragrl.rewards.kg import entity_f1, hits_at_1, observations, retrieval_hit

    golds = row_golds(row)
    return {"hits1": hits_at_1(trajectory.answer, golds), "entity_f1": entity_f1(trajectory.answer, golds),
            "retrieval_hit": retrieval_hit(observations(recorded_turns(trajectory)), golds)}


def _whole_store(backend):
    """The whole KG of an in-process service: gold planning walks it directly (in subgraph mode
    the observations still come from each question's subgraph, through the environment)."""
    sources = list(getattr(backend, "sources", {}).values())
    store = sources[0].store if len(sources) == 1 else None
    if store is None:
        raise InputError("gold KG trajectories need one in-process KG with its whole graph (--kg DIR, not --kg-url; "
                         "the simple KGQA format has no whole graph in subgraph mode)")
    return store


def gold_sft(recipe, qa, policy, env, backends, out, limit=None) -> dict:
    from ragrl.train.kg_sft_data import kg_gold_sft_stage

    return kg_gold_sft_stage(qa, policy, env, _whole_store(backends["graph"]), out, rollout_cfg=recipe.rollout,
                             limit=limit, max_hops=recipe.options.max_hops,
                             readable_share=recipe.options.readable_relations,
                             readable_copies=recipe.options.readable_copies,
                             restate_question=recipe.options.restate_question)


def kg_gold_reason(dataset: Mapping[str, Any]) -> str | None:
    # Gold paths start from named topic entities; the simple KGQA format names them by index only.
    if dataset.get("format") == "kgqa" and str(dataset.get("path", "")).endswith(".parquet"):
        return None
    return (f"gold KG paths need KGQA rows with named topic entities (format kgqa, a parquet), and dataset "
            f"{dataset.get('path')!r} (format {dataset.get('format')}) is not one")


METHOD = Method(
    name="kg",
    summary="KG-R1: one-hop KG queries, turn-level format/query/answer rewards + entity-F1/retrieval",
    make_environment=make_environment,
    score=score,
    inputs=("graph",),
    reward_keys=REWARD_KEYS,
    default_reward={"f1": 0.3, "retrieval": 0.4},
    turn_reward_keys=TURN_REWARD_KEYS,
    options=KGOptions,
    gold_sft=gold_sft,
    gold_sft_reason=kg_gold_reason,
    eval_metrics=eval_metrics,
    eval_metric_columns=EVAL_COLUMNS,
)
