"""A recipe (one method's settings from config) → the typed settings each stage takes.

Rules pass a recipe to the CLI as one JSON object (`--recipe '{...}'`): Snakemake re-runs a job
when its params change, so editing one recipe re-executes only that recipe's jobs, and the log
holds the whole command. Every value is checked here, with the config key named.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from ragrl.agent.rollout import RolloutConfig

ENVIRONMENTS = ("search", "multi_query_search", "kg", "none")
# Reward components a recipe may weigh, per environment. Search: answer metrics and format
# (ragrl.rewards.qa). KG (KG-R1, ragrl.rewards.kg): global entity-F1 / Hits@1 / retrieval hit /
# format, plus per-turn format / query / answer rewards under `turn_reward`.
REWARD_KEYS = {"search": ("em", "f1", "cover_em", "format"), "kg": ("f1", "hits1", "retrieval", "format")}
TURN_REWARD_KEYS = ("format", "query", "answer")


@dataclass(frozen=True)
class Recipe:
    name: str
    env: str
    topk: int
    max_queries: int
    rollout: RolloutConfig
    sft: dict = field(default_factory=dict)
    rl: dict = field(default_factory=dict)
    reward: dict = field(default_factory=lambda: {"em": 1.0})
    turn_reward: dict = field(default_factory=dict)  # KG-R1 per-turn reward weights (env kg only)
    seed: int = 0


def _build(cls, values: dict, key: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"config key '{key}': unknown setting(s) {unknown}; known: {sorted(names)}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config key '{key}': {exc}") from None


def parse_recipe(raw: str | dict, name: str = "recipe") -> Recipe:
    data = json.loads(raw) if isinstance(raw, str) else dict(raw)
    key = f"recipes.{name}"
    env = data.get("env", "search")
    if env not in ENVIRONMENTS:
        raise ValueError(f"config key '{key}.env': {env!r} is not one of {ENVIRONMENTS}")
    rollout = _build(RolloutConfig, dict(data.get("rollout", {})), f"{key}.rollout")
    known_rewards = REWARD_KEYS["kg" if env == "kg" else "search"]
    reward = _weights(data.get("reward", {"f1": 0.3, "retrieval": 0.4} if env == "kg" else {"em": 1.0}),
                      known_rewards, f"{key}.reward", nonempty=True)
    turn_reward = _weights(data.get("turn_reward", {}), TURN_REWARD_KEYS, f"{key}.turn_reward")
    if turn_reward and env != "kg":
        raise ValueError(f"config key '{key}.turn_reward': per-turn rewards need env 'kg', not {env!r}")
    return Recipe(
        name=name, env=env, topk=int(data.get("topk", 3)), max_queries=int(data.get("max_queries", 1)),
        rollout=rollout, sft=dict(data.get("sft", {})), rl=dict(data.get("rl", {})), reward=reward,
        turn_reward=turn_reward, seed=int(data.get("seed", 0)),
    )


def _weights(raw: dict, known: tuple[str, ...], key: str, nonempty: bool = False) -> dict[str, float]:
    weights = {str(k): float(v) for k, v in dict(raw).items()}
    if (nonempty and not weights) or set(weights) - set(known):
        what = "a non-empty subset" if nonempty else "a subset"
        raise ValueError(f"config key '{key}': weights must be {what} of {sorted(known)}, got {sorted(weights)}")
    return weights


def sft_args(recipe: Recipe):
    from ragrl.train.sft import SFTArgs

    values = {k: v for k, v in recipe.sft.items() if k not in ("enabled", "limit", "max_hops")}
    values.setdefault("seed", recipe.seed)
    if "lora_target_modules" in values:
        values["lora_target_modules"] = tuple(values["lora_target_modules"])
    return _build(SFTArgs, values, f"recipes.{recipe.name}.sft")


def rl_config(recipe: Recipe):
    from ragrl.train.rl import RLConfig

    # backend (local | verl) and verl (extra verl overrides) choose the trainer, not its settings.
    values = {k: v for k, v in recipe.rl.items() if k not in ("limit", "backend", "verl")}
    values.setdefault("seed", recipe.seed)
    # The trainer scores log-probs of softmax(logits / T): it must be the rollout's temperature.
    values.setdefault("temperature", recipe.rollout.temperature)
    return _build(RLConfig, values, f"recipes.{recipe.name}.rl")


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
