"""Stages of the search-agent recipes (Search-R1, RAG-R1): SFT data, SFT, RL, evaluation.

Each function is what one CLI command (and so one Snakemake rule) runs: it loads what the
command names, wires the environment, rollout engine and rewards together, and calls the core.
"""

from __future__ import annotations

from pathlib import Path

from ragrl.recipe import Recipe, sft_args
from ragrl.stages.agent_rl import group_rollouts, train_agent


def load_retriever(index: Path | None, bm25: Path | None, mode: str | None, passages: Path | None = None):
    """In-process search over the workflow's indexes; None when the recipe does not search."""
    if index is None and bm25 is None:
        return None
    from ragrl.retrieval.searcher import load_searcher

    return load_searcher(index, bm25, mode, passages=passages)


def sft_data(recipe: Recipe, qa: Path, policy: Path, retriever, out: Path, limit: int | None = None) -> dict:
    from ragrl.train.sft_data import gold_sft_stage

    return gold_sft_stage(qa, policy, recipe.env, retriever, out, rollout_cfg=recipe.rollout, topk=recipe.topk,
                          max_queries=recipe.max_queries, limit=limit, seed=recipe.seed)


def sft(recipe: Recipe, data: Path, policy: Path, out: Path) -> Path:
    from ragrl.train.sft import train_sft

    return train_sft(policy, data, out, sft_args(recipe))


def _reward_fn(recipe: Recipe):
    from ragrl.rewards.qa import composite_reward

    def reward(trajectory, golds) -> float:
        return composite_reward(trajectory, golds, recipe.reward, env=recipe.env)

    return reward


def make_rollout_fn(recipe: Recipe, tokenizer, retriever):
    """The RL trainer's plug-in: a group of rollouts per prompt with the current policy, scored."""
    from ragrl.agent.environments import make_environment
    from ragrl.agent.retriever_adapter import AgentRetriever
    from ragrl.train.rl import Sample

    # The environments take plain dicts; the searcher and the HTTP client return Hits.
    env = make_environment(recipe.env, AgentRetriever(retriever), topk=recipe.topk, max_queries=recipe.max_queries)
    reward = _reward_fn(recipe)

    def rollout_fn(batch_prompts: list[dict], group_size: int, model, step: int) -> list[Sample]:
        samples = []
        for traj in group_rollouts(recipe, tokenizer, env, batch_prompts, group_size, model, step):
            golds = batch_prompts[traj.prompt_index]["golden_answers"]
            samples.append(Sample(
                prompt_ids=list(traj.prompt_ids), response_ids=list(traj.response_ids),
                loss_mask=list(traj.loss_mask), turn_index=list(traj.turn_index),
                reward=reward(traj, golds), group=traj.prompt_index,
                stats={"searches": traj.num_searches, "response_length": len(traj.response_ids)},
            ))
        return samples

    return rollout_fn


def rl(recipe: Recipe, qa: Path, policy: Path, retriever, out_dir: Path, limit: int | None = None,
       log_out: Path | None = None, inputs: dict | None = None) -> Path:
    return train_agent(recipe, qa, policy, out_dir, lambda tok: make_rollout_fn(recipe, tok, retriever),
                       limit=limit, log_out=log_out, inputs=inputs)


def evaluate(recipe: Recipe, model: Path, qa: Path, retriever, out_dir: Path, *, run_id: str, dataset: str,
             max_questions: int | None = None, batch_size: int = 32) -> dict:
    from ragrl.eval.evaluate import evaluate as run_eval

    return run_eval(model, qa, recipe.env, retriever, out_dir, run_id=run_id, dataset=dataset,
                    rollout_cfg=recipe.rollout, batch_size=batch_size, max_questions=max_questions,
                    topk=recipe.topk, max_queries=recipe.max_queries)
