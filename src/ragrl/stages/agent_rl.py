"""What every agent method's RL stage shares: group rollouts with the current policy, scored by
the method's reward, the resumable work directory, and the run of the trainer. Methods differ
only in their environment and their `score` hook (ragrl.methods)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from ragrl.io import atomic_path, read_columns
from ragrl.recipe import Recipe, rl_config


def group_rollouts(recipe: Recipe, tokenizer, env, batch_prompts: list[dict], group_size: int, model, step: int):
    """`group_size` trajectories per prompt with the current policy (prompt-major order), on the
    method's episode engine."""
    from ragrl.agent.generation import HFGenerator

    generator = HFGenerator(model, tokenizer.pad_token_id, tokenizer)
    engine = recipe.method.make_engine(generator, tokenizer, env, dataclasses.replace(recipe.rollout, n=group_size))
    # A distinct, reproducible seed per step: the same step re-run after a resume samples the same.
    return engine.run_rows(batch_prompts, n=group_size, seed=recipe.seed * 100_003 + step)


def make_rollout_fn(recipe: Recipe, tokenizer, env):
    """The RL trainer's plug-in: a group of rollouts per prompt with the current policy, each
    scored by the recipe's method (global reward, optional per-turn rewards, logged components)."""
    from ragrl.train.rl import Sample

    score = recipe.method.score

    def rollout_fn(batch_prompts: list[dict], group_size: int, model, step: int) -> list[Sample]:
        samples = []
        for traj in group_rollouts(recipe, tokenizer, env, batch_prompts, group_size, model, step):
            s = score(recipe, traj, batch_prompts[traj.prompt_index])
            samples.append(Sample(
                prompt_ids=list(traj.prompt_ids), response_ids=list(traj.response_ids),
                loss_mask=list(traj.loss_mask), turn_index=list(traj.turn_index),
                reward=float(s.reward), group=traj.prompt_index, turn_rewards=s.turn_rewards,
                stats={"searches": traj.num_searches, "response_length": len(traj.response_ids),
                       **{f"reward_{k}": float(v) for k, v in s.components.items()}},
            ))
        return samples

    return rollout_fn


def train_agent(recipe: Recipe, qa: Path, policy: Path, out_dir: Path, env, *, limit: int | None = None,
                log_out: Path | None = None, fingerprint: dict | None = None, inputs: dict | None = None) -> Path:
    """RL of `policy` on the questions of `qa` in `env`. `fingerprint`: other settings the training
    depends on, `inputs`: other files or directories it reads (index, KG); both key the resume
    check, with the policy and the QA file, by content."""
    from transformers import AutoTokenizer

    from ragrl.train.checkpoint import prepare_work_dir
    from ragrl.train.rl import train_rl

    # Everything that can be wrong with the settings or the data fails here, before the work dir
    # (a previous training's checkpoints) is touched.
    cfg = rl_config(recipe)
    table = read_columns(qa, ["id", "question", "golden_answers"],
                         optional=("metadata", *recipe.method.row_columns)).to_pylist()
    prompts = table[:limit] if limit else table
    prepare_work_dir(Path(out_dir), {"recipe": dataclasses.asdict(recipe), "limit": limit, **(fingerprint or {})},
                     {"policy": policy, "qa": qa, **(inputs or {})})
    tokenizer = AutoTokenizer.from_pretrained(policy)
    final = train_rl(policy, None, prompts, make_rollout_fn(recipe, tokenizer, env), cfg, out_dir)
    if log_out is not None:
        # The running log lives next to the checkpoints (it must survive a kill); the declared
        # output is a copy made once training is complete.
        with atomic_path(log_out) as tmp:
            shutil.copyfile(Path(out_dir) / "train_log.jsonl", tmp)
    return final
