"""Stages of the search-agent recipes (Search-R1, RAG-R1): SFT data, SFT, RL, evaluation.

Each function is what one CLI command (and so one Snakemake rule) runs: it loads what the
command names, wires the environment, rollout engine and rewards together, and calls the core.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from ragrl.io import atomic_path
from ragrl.recipe import Recipe, canonical_json, rl_config, sft_args


def load_retriever(index: Path | None, bm25: Path | None, mode: str | None):
    """In-process search over the workflow's indexes; None when the recipe does not search."""
    if index is None and bm25 is None:
        return None
    from ragrl.retrieval.searcher import load_searcher

    return load_searcher(index, bm25, mode)


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
    from ragrl.agent.generation import HFGenerator
    from ragrl.agent.retriever_adapter import AgentRetriever
    from ragrl.agent.rollout import RolloutEngine
    from ragrl.train.rl import Sample

    # The environments take plain dicts; the searcher and the HTTP client return Hits.
    env = make_environment(recipe.env, AgentRetriever(retriever), topk=recipe.topk, max_queries=recipe.max_queries)
    reward = _reward_fn(recipe)

    def rollout_fn(batch_prompts: list[dict], group_size: int, model, step: int) -> list[Sample]:
        generator = HFGenerator(model, tokenizer.pad_token_id, tokenizer)
        cfg = dataclasses.replace(recipe.rollout, n=group_size)
        engine = RolloutEngine(generator, tokenizer, env, cfg)
        # A distinct, reproducible seed per step: the same step re-run after a resume samples the same.
        trajectories = engine.run_questions([p["question"] for p in batch_prompts], n=group_size,
                                            seed=recipe.seed * 100_003 + step)
        samples = []
        for traj in trajectories:
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
       log_out: Path | None = None) -> Path:
    from transformers import AutoTokenizer

    from ragrl.train.rl import train_rl

    table = pq.read_table(qa, columns=["question", "golden_answers"]).to_pylist()
    prompts = table[:limit] if limit else table
    _prepare_work_dir(Path(out_dir), {"recipe": dataclasses.asdict(recipe), "policy": str(policy), "qa": str(qa),
                                      "limit": limit})
    tokenizer = AutoTokenizer.from_pretrained(policy)
    final = train_rl(policy, None, prompts, make_rollout_fn(recipe, tokenizer, retriever), rl_config(recipe), out_dir)
    if log_out is not None:
        # The running log lives next to the checkpoints (it must survive a kill); the declared
        # output is a copy made once training is complete.
        with atomic_path(log_out) as tmp:
            shutil.copyfile(Path(out_dir) / "train_log.jsonl", tmp)
    return final


def _prepare_work_dir(out_dir: Path, definition: dict) -> None:
    """Keep checkpoints only if they belong to this exact training; they are what a killed job
    resumes from, but a job re-run because its settings changed must start over, not resume."""
    fingerprint = hashlib.sha256(canonical_json(definition).encode()).hexdigest()
    stamp = out_dir / "definition.sha256"
    if out_dir.exists() and (not stamp.exists() or stamp.read_text().strip() != fingerprint):
        print(f"[rl] settings changed since the checkpoints in {out_dir} were written: starting over")
        shutil.rmtree(out_dir)
    final = out_dir / "final"
    if final.exists() and not (final / "model.safetensors").exists():
        # Snakemake removed the declared output (a forced re-run): rebuild final/ from the last
        # checkpoint instead of reporting the finished run as done without its weights.
        shutil.rmtree(final)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(stamp) as tmp:
        tmp.write_text(fingerprint + "\n")


def evaluate(recipe: Recipe, model: Path, qa: Path, retriever, out_dir: Path, *, run_id: str, dataset: str,
             max_questions: int | None = None, batch_size: int = 32) -> dict:
    from ragrl.eval.evaluate import evaluate as run_eval

    return run_eval(model, qa, recipe.env, retriever, out_dir, run_id=run_id, dataset=dataset,
                    rollout_cfg=recipe.rollout, batch_size=batch_size, max_questions=max_questions,
                    topk=recipe.topk, max_queries=recipe.max_queries)
