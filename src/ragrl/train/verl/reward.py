"""Our QA reward as verl's custom reward function (`reward.custom_reward_function.path/name`).

verl loads this file by path (`verl.trainer.ppo.reward.get_custom_reward_fn`) and its reward
manager calls `compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`
once per trajectory, with `reward.custom_reward_function.reward_kwargs` merged in: the launcher
puts the recipe's reward weights and environment there, so this module holds no settings.

`solution_str` is the whole decoded response, observations included (verl decodes the response
ids with skip_special_tokens=True; the protocol tags are ordinary added tokens, so they survive).
That is exactly the text the local backend scores: `composite_reward` extracts the last
<answer> outside <information> blocks, and the format reward walks the turns between them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ragrl.rewards.qa import composite_reward


def golds_of(ground_truth: Any) -> list[str]:
    """verl's `reward_model.ground_truth` as written by ragrl.train.verl.data: a list of answers.

    Parquet round trips turn the list into a numpy array; a single string is one answer.
    """
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, Mapping):  # {"target": [...]}, the layout of verl's own QA examples
        return golds_of(ground_truth.get("target", []))
    if isinstance(ground_truth, Iterable):
        return [str(g) for g in ground_truth]
    raise TypeError(f"ground_truth must be a string or a list of strings, got {type(ground_truth).__name__}")


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, *,
                  weights: Mapping[str, float] | None = None, env: str = "search", **_: Any) -> dict:
    """{"score": weighted reward, plus each metric}: verl logs every key of the dict per step.

    `**_` takes what verl's reward managers may add (reward_router_address, ...), unused here.
    """
    weights = dict(weights or {"em": 1.0})
    golds = golds_of(ground_truth)
    score = composite_reward(solution_str, golds, weights, env=env)
    # The metrics one by one, whatever the weights: the training log shows em/f1/format separately.
    parts = {key: composite_reward(solution_str, golds, {key: 1.0}, env=env)
             for key in ("em", "f1", "cover_em", "format")}
    return {"score": float(score), **parts}
