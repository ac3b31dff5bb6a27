"""Our QA reward as verl's custom reward function (`reward.custom_reward_function.path/name`).

verl loads this file by path (`verl.trainer.ppo.reward.get_custom_reward_fn`) and its reward
manager calls `compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`
once per trajectory, with `reward.custom_reward_function.reward_kwargs` merged in: the launcher
puts the recipe's reward weights and environment there, so this module holds no settings.

What is scored is the trajectory our agent loop (`ragrl.verl.agent_loop`) recorded, which
verl's reward loop hands over in `extra_info` (it merges the loop's `extra_fields` there): the
engine's answer and its turn record, what the policy wrote and what the environment inserted,
turn by turn. `solution_str`, the decoded response, cannot tell an <information> block the policy
typed from one the environment returned, so it is only logged, never parsed for a reward.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ragrl.errors import InputError
from ragrl.methods import get_method


def golds_of(ground_truth: Any) -> list[str]:
    """verl's `reward_model.ground_truth` as written by ragrl.verl.data: a list of answers.

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

    The recipe's method scores the recorded trajectory (`Method.verl_reward`). `**_` takes what
    verl's reward managers may add (reward_router_address, ...), unused here.
    """
    method = get_method(env, plugin or None)
    if method.verl_reward is None:
        raise InputError(f"method {env!r} has no verl reward, so it cannot train on verl")
    return method.verl_reward(dict(weights or method.default_reward), recorded_trajectory(solution_str, extra_info),
                              golds_of(ground_truth))


def recorded_trajectory(solution_str: str, extra_info: Mapping[str, Any] | None) -> dict:
    """The trajectory of one response from what our agent loop put in its `extra_fields`."""
    info = extra_info or {}
    if "ragrl_turns" not in info:
        raise ValueError("extra_info has no 'ragrl_turns': ragrl's verl reward scores the turns its agent loop "
                         f"(ragrl_agent) recorded, and this response came without them (extra_info keys: {sorted(info)})")
    return {"response_text": solution_str, "answer": info.get("ragrl_answer"), "actions": list(info["ragrl_turns"])}
