"""Stages of the KG agent recipe (KG-R1): SFT data, RL with turn-level rewards, evaluation.

The agent talks to a KG through `KGEnvironment`; the backend is the KG service in-process (the
same `KGService.retrieve` that `ragrl serve-kg` exposes over HTTP) or, with a URL, a running
server. Swapping the KG behind it (KG A for training, KG B for zero-shot transfer) changes
nothing else: same policy, prompt and protocol, which is KG-R1's transfer setting.
"""

from __future__ import annotations

from pathlib import Path

from ragrl.recipe import Recipe
from ragrl.stages.agent_rl import group_rollouts, train_agent


def load_kg_backend(kg: Path | None = None, mode: str = "whole", url: str | None = None):
    """The KG behind the environment: in-process service over `kg`, or a client of `url`."""
    if url:
        from ragrl.kg.client import KGClient

        return KGClient(url)
    if kg is None:
        raise ValueError("a kg recipe needs --kg DIR (or --kg-url URL)")
    from ragrl.kg.server import KGService
    from ragrl.kg.store import load_kg

    return KGService(load_kg(kg, mode))


def make_environment(backend):
    from ragrl.kg.environment import KGEnvironment

    return KGEnvironment(backend)


def _store(backend):
    """The whole KG of an in-process service: gold planning walks it directly (in subgraph mode
    the observations still come from each question's subgraph, through the environment)."""
    sources = list(getattr(backend, "sources", {}).values())
    store = sources[0].store if len(sources) == 1 else None
    if store is None:
        raise ValueError("gold KG trajectories need one in-process KG with its whole graph (--kg DIR, not --kg-url; "
                         "the simple KGQA format has no whole graph in subgraph mode)")
    return store


def sft_data(recipe: Recipe, qa: Path, policy: Path, backend, out: Path, limit: int | None = None) -> dict:
    from ragrl.train.kg_sft_data import kg_gold_sft_stage

    max_hops = int(recipe.sft.get("max_hops", 2))
    return kg_gold_sft_stage(qa, policy, make_environment(backend), _store(backend), out,
                             rollout_cfg=recipe.rollout, limit=limit, max_hops=max_hops)


def make_rollout_fn(recipe: Recipe, tokenizer, backend):
    """Groups of KG rollouts scored with KG-R1's rewards: a global reward per trajectory and one
    reward per assistant turn, aligned with the engine's per-token turn index."""
    from ragrl.data.qa import row_golds
    from ragrl.rewards.kg import DEFAULT_TURN_WEIGHTS, kg_rewards
    from ragrl.train.rl import Sample

    env = make_environment(backend)
    turn_weights = recipe.turn_reward or DEFAULT_TURN_WEIGHTS

    def rollout_fn(batch_prompts: list[dict], group_size: int, model, step: int) -> list[Sample]:
        trajectories = group_rollouts(recipe, tokenizer, env, batch_prompts, group_size, model, step)
        samples = []
        for traj in trajectories:
            golds = row_golds(batch_prompts[traj.prompt_index])
            r = kg_rewards(traj.response_text, golds, turn_weights, recipe.reward, answer=traj.answer)
            # split_turns counts the turns in the decoded text; the engine's turn index counts
            # generation calls. They agree except when a turn generated nothing decodable; then
            # the turn rewards are dropped for that sample (it keeps its global reward).
            turns = max(traj.turn_index, default=-1) + 1
            samples.append(Sample(
                prompt_ids=list(traj.prompt_ids), response_ids=list(traj.response_ids),
                loss_mask=list(traj.loss_mask), turn_index=list(traj.turn_index),
                reward=r.global_reward, group=traj.prompt_index,
                turn_rewards=r.turn_rewards if len(r.turn_rewards) == turns else None,
                stats={"searches": traj.num_searches, "response_length": len(traj.response_ids),
                       "turn_reward_mean": sum(r.turn_rewards) / len(r.turn_rewards) if r.turn_rewards else 0.0,
                       **{f"reward_{k}": v for k, v in r.global_components.items()}},
            ))
        return samples

    return rollout_fn


def rl(recipe: Recipe, qa: Path, policy: Path, backend, out_dir: Path, limit: int | None = None,
       log_out: Path | None = None, inputs: dict | None = None) -> Path:
    return train_agent(recipe, qa, policy, out_dir, lambda tok: make_rollout_fn(recipe, tok, backend),
                       limit=limit, log_out=log_out, fingerprint={"kg": backend.health().get("datasets", {})},
                       inputs=inputs)


def evaluate(recipe: Recipe, model: Path, qa: Path, backend, out_dir: Path, *, run_id: str, dataset: str,
             max_questions: int | None = None, batch_size: int = 32) -> dict:
    from ragrl.eval.evaluate import evaluate as run_eval

    return run_eval(model, qa, "kg", None, out_dir, run_id=run_id, dataset=dataset, rollout_cfg=recipe.rollout,
                    batch_size=batch_size, max_questions=max_questions, env=make_environment(backend))
