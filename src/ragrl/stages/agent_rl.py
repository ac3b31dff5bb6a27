"""What every agent recipe's RL stage shares: group rollouts with the current policy, the
resumable work directory, and the run of the trainer. The recipes differ only in their
environment and in how a trajectory is scored (their `make_rollout_fn`)."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

from ragrl import workdir
from ragrl.io import atomic_path, read_columns
from ragrl.recipe import Recipe, rl_config


def group_rollouts(recipe: Recipe, tokenizer, env, batch_prompts: list[dict], group_size: int, model, step: int):
    """`group_size` trajectories per prompt with the current policy (prompt-major order)."""
    from ragrl.agent.generation import HFGenerator
    from ragrl.agent.rollout import RolloutEngine

    generator = HFGenerator(model, tokenizer.pad_token_id, tokenizer)
    engine = RolloutEngine(generator, tokenizer, env, dataclasses.replace(recipe.rollout, n=group_size))
    # A distinct, reproducible seed per step: the same step re-run after a resume samples the same.
    # Question ids reach environments that answer per question (KG subgraph mode).
    return engine.run_questions([p["question"] for p in batch_prompts], n=group_size,
                                seed=recipe.seed * 100_003 + step,
                                sample_ids=[str(p["id"]) for p in batch_prompts])


def train_agent(recipe: Recipe, qa: Path, policy: Path, out_dir: Path, make_rollout_fn: Callable, *,
                limit: int | None = None, log_out: Path | None = None, fingerprint: dict | None = None,
                inputs: dict | None = None) -> Path:
    """RL of `policy` on the questions of `qa`; `make_rollout_fn(tokenizer)` builds the trainer's
    plug-in. `fingerprint`: other settings the training depends on, `inputs`: other files or
    directories it reads (index, KG); both key the resume check."""
    from transformers import AutoTokenizer

    from ragrl.train.rl import train_rl

    # Everything that can be wrong with the settings or the data fails here, before the work dir
    # (a previous training's checkpoints) is touched.
    cfg = rl_config(recipe)
    table = read_columns(qa, ["id", "question", "golden_answers", "metadata"]).to_pylist()
    prompts = table[:limit] if limit else table
    prepare_work_dir(Path(out_dir), {"recipe": dataclasses.asdict(recipe), "limit": limit, **(fingerprint or {})},
                     {"policy": policy, "qa": qa, **(inputs or {})})
    tokenizer = AutoTokenizer.from_pretrained(policy)
    final = train_rl(policy, None, prompts, make_rollout_fn(tokenizer), cfg, out_dir)
    if log_out is not None:
        # The running log lives next to the checkpoints (it must survive a kill); the declared
        # output is a copy made once training is complete.
        with atomic_path(log_out) as tmp:
            shutil.copyfile(Path(out_dir) / "train_log.jsonl", tmp)
    return final


def prepare_work_dir(out_dir: Path, definition: dict, inputs: dict | None = None) -> None:
    """Keep checkpoints only if they belong to this exact training (settings and input contents,
    see ragrl.workdir): they are what a killed job resumes from, but a job re-run because its
    settings or inputs changed must start over, and the old checkpoints are only set aside."""
    workdir.prepare_work_dir(out_dir, definition, inputs, tag="rl")
    final = out_dir / "final"
    if workdir.is_main_process() and final.exists() and not (final / "model.safetensors").exists():
        # Snakemake removed the declared output (a forced re-run): rebuild final/ from the last
        # checkpoint instead of reporting the finished run as done without its weights.
        shutil.rmtree(final)
