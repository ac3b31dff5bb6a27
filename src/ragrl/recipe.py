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

ENVIRONMENTS = ("search", "multi_query_search", "none")


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
    reward = {str(k): float(v) for k, v in data.get("reward", {"em": 1.0}).items()}
    known_rewards = {"em", "f1", "cover_em", "format"}
    if not reward or set(reward) - known_rewards:
        raise ValueError(f"config key '{key}.reward': weights must be a non-empty subset of {sorted(known_rewards)}")
    return Recipe(
        name=name, env=env, topk=int(data.get("topk", 3)), max_queries=int(data.get("max_queries", 1)),
        rollout=rollout, sft=dict(data.get("sft", {})), rl=dict(data.get("rl", {})), reward=reward,
        seed=int(data.get("seed", 0)),
    )


def sft_args(recipe: Recipe):
    from ragrl.train.sft import SFTArgs

    values = {k: v for k, v in recipe.sft.items() if k not in ("enabled", "limit")}
    values.setdefault("seed", recipe.seed)
    if "lora_target_modules" in values:
        values["lora_target_modules"] = tuple(values["lora_target_modules"])
    return _build(SFTArgs, values, f"recipes.{recipe.name}.sft")


def rl_config(recipe: Recipe):
    from ragrl.train.rl import RLConfig

    values = {k: v for k, v in recipe.rl.items() if k not in ("limit",)}
    values.setdefault("seed", recipe.seed)
    # The trainer scores log-probs of softmax(logits / T): it must be the rollout's temperature.
    values.setdefault("temperature", recipe.rollout.temperature)
    return _build(RLConfig, values, f"recipes.{recipe.name}.rl")


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
