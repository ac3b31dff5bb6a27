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

from ragrl.methods import get_method


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
                  weights: Mapping[str, float] | None = None, env: str = "search", plugin: str = "", **_: Any) -> dict:
    """{"score": weighted reward, plus each metric}: verl logs every key of the dict per step.

    The recipe's method scores the text (`Method.text_reward`). `**_` takes what verl's reward
    managers may add (reward_router_address, ...), unused here.
    """
    method = get_method(env, plugin or None)
    if method.text_reward is None:
        raise ValueError(f"method {env!r} has no text reward, so it cannot train on verl")
    return method.text_reward(dict(weights or method.default_reward), solution_str, golds_of(ground_truth))
