"""What every agent method's RL stage shares: group rollouts with the current policy, scored by
the method's reward, the resumable work directory, and the run of the trainer. Methods differ
only in their environment and their `score` hook (ragrl.methods)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ragrl.data.qa import read_qa_rows
from ragrl.errors import InputError
from ragrl.io import atomic_path
from ragrl.recipe import Recipe, rl_config


# (current policy, step) -> the Generator that samples that step's rollouts.
GeneratorFor = Callable[[object, int], object]


def hf_generators(tokenizer) -> GeneratorFor:
    """Rollouts by `generate` on the trainer's own model, in its process."""
    from ragrl.agent.generation import HFGenerator

    return lambda model, step: HFGenerator(model, tokenizer.pad_token_id, tokenizer)


def group_rollouts(recipe: Recipe, tokenizer, env, batch_prompts: list[dict], group_size: int, model, step: int,
                   generators: GeneratorFor | None = None, generator=None, temperature: float | None = None):
    """`group_size` trajectories per prompt with the current policy (prompt-major order), on the
    method's episode engine, sampled by `generator`, else `generators(model, step)` (default: HF
    in process), at `temperature` if given (0: greedy), else the recipe's."""
    if generator is None:
        generator = (generators or hf_generators(tokenizer))(model, step)
    rollout = dataclasses.replace(recipe.rollout, n=group_size)
    if temperature is not None:
        rollout = dataclasses.replace(rollout, temperature=temperature)
    engine = recipe.method.make_engine(generator, tokenizer, env, rollout)
    # A distinct, reproducible seed per step: the same step re-run after a resume samples the same.
    return engine.run_rows(batch_prompts, n=group_size, seed=recipe.seed * 100_003 + step)


def greedy_rewards(recipe: Recipe, tokenizer, env, batch_prompts: list[dict], generator, step: int) -> list[float]:
    """Per prompt, the method's reward for `generator`'s greedy rollout (the current policy's):
    algorithm remax's baseline, and what the evaluation of the policy would score on these prompts."""
    rewards = [0.0] * len(batch_prompts)
    for traj in group_rollouts(recipe, tokenizer, env, batch_prompts, 1, None, step, generator=generator,
                               temperature=0.0):
        rewards[traj.prompt_index] = float(recipe.method.score(recipe, traj, batch_prompts[traj.prompt_index]).reward)
    return rewards


def make_rollout_fn(recipe: Recipe, tokenizer, env, generators: GeneratorFor | None = None):
    """The RL trainer's plug-in: a group of rollouts per prompt with the current policy, each
    scored by the recipe's method (global reward, optional per-turn rewards, logged components).
    `generators`: what samples them (rollout_generators; default HF in process). Under algorithm
    remax each sample also carries its prompt's greedy reward (train_log's `greedy_reward`)."""
    from ragrl.train.rl import Sample

    score = recipe.method.score
    with_baseline = rl_config(recipe).greedy_baseline

    def rollout_fn(batch_prompts: list[dict], group_size: int, model, step: int) -> list[Sample]:
        # One generator a step: a vLLM one syncs the policy's weights to its server when made.
        generator = (generators or hf_generators(tokenizer))(model, step)
        baselines = greedy_rewards(recipe, tokenizer, env, batch_prompts, generator, step) if with_baseline else None
        samples = []
        for traj in group_rollouts(recipe, tokenizer, env, batch_prompts, group_size, model, step, generator=generator):
            s = score(recipe, traj, batch_prompts[traj.prompt_index])
            greedy = baselines[traj.prompt_index] if baselines is not None else None
            samples.append(Sample(
                prompt_ids=list(traj.prompt_ids), response_ids=list(traj.response_ids),
                loss_mask=list(traj.loss_mask), turn_index=list(traj.turn_index),
                reward=float(s.reward), group=traj.prompt_index, turn_rewards=s.turn_rewards,
                baseline=greedy,
                stats={"searches": traj.num_searches, "response_length": len(traj.response_ids),
                       **{f"reward_{k}": float(v) for k, v in s.components.items()},
                       **({"greedy_reward": greedy} if greedy is not None else {})},
            ))
        return samples

    return rollout_fn


def rollout_engine(recipe: Recipe) -> tuple[str, str | None]:
    """("hf", None) or ("vllm", interpreter with vLLM) for the recipe's rl.rollout_engine; an
    explicit vllm without vLLM is an error, auto without it falls back to hf with a notice."""
    engine = recipe.rl.get("rollout_engine", "hf")
    if engine == "hf":
        return "hf", None
    from ragrl.agent.vllm_sync import RolloutEngineUnavailable, find_vllm_python

    key = f"recipes.{recipe.name}.rl.rollout_engine"
    python, why = find_vllm_python(recipe.rl.get("rollout_serve") or {})
    if python is None:
        if engine == "vllm":
            raise RolloutEngineUnavailable(
                f"config key '{key}': vllm, but no vLLM was found ({why}); set rl.rollout_serve.python or "
                "$RAGRL_VLLM_PYTHON to an interpreter with vLLM (scripts/vllm_venv.sh), or use auto or hf")
        print(f"[rl] {key} auto: no vLLM ({why}); rollouts use HF generate in the trainer's process",
              file=sys.stderr, flush=True)
        return "hf", None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        # One server per trainer process would need each process's share of the GPUs and its own
        # sync; not built (docs/RL.md).
        if engine == "vllm":
            raise InputError(f"config key '{key}': vllm rollouts run with one trainer process, not {world} "
                             "(WORLD_SIZE); use hf or auto under a multi-process launch")
        print(f"[rl] {key} auto: {world} trainer processes, vLLM rollouts need one; rollouts use HF generate "
              "in each trainer process", file=sys.stderr, flush=True)
        return "hf", None
    return "vllm", python


@contextmanager
def rollout_generators(recipe: Recipe, tokenizer, policy: Path, work_dir: Path,
                       engine: tuple[str, str | None] = ("hf", None)) -> Iterator[GeneratorFor]:
    """What samples the training's rollouts (`engine` from rollout_engine), for the duration of the
    block: HF in process, or a vLLM server started here and stopped on exit, whose weights follow
    the trainer's (ragrl.agent.vllm_sync)."""
    kind, python = engine
    if kind == "hf":
        yield hf_generators(tokenizer)
        return
    from ragrl.agent.vllm_sync import vllm_policy_server

    with vllm_policy_server(policy, Path(work_dir) / "rollout_server", recipe.rl.get("rollout_serve") or {},
                            python) as server:
        yield server.generator_for


# How the work is split and where it runs, not what is trained: a change of these resumes the
# checkpoints (the trainer logs the change) instead of moving them aside, so lowering the chunk size
# after an out-of-memory, or a longer server start-up, keeps hours of RL.
RESUMABLE_RL_KEYS = ("micro_batch_size", "logprob_chunk_tokens", "padding_free", "rollout_engine",
                     "rollout_serve", "checkpoint_every", "keep_checkpoints")


def resume_key(recipe: Recipe) -> dict:
    """The recipe as the work dir's resume check compares it (RESUMABLE_RL_KEYS left out)."""
    key = dataclasses.asdict(recipe)
    key["rl"] = {k: v for k, v in (key.get("rl") or {}).items() if k not in RESUMABLE_RL_KEYS}
    return key


def train_agent(recipe: Recipe, qa: Path, policy: Path, out_dir: Path, env, *, limit: int | None = None,
                log_out: Path | None = None, fingerprint: dict | None = None, inputs: dict | None = None) -> Path:
    """RL of `policy` on the questions of `qa` in `env`. `fingerprint`: other settings the training
    depends on, `inputs`: other files or directories it reads (index, KG); both key the resume
    check, with the policy and the QA file, by content."""
    from transformers import AutoTokenizer

    from ragrl.train.checkpoint import is_finished, prepare_work_dir
    from ragrl.train.rl import train_rl

    # Everything that can be wrong with the settings or the data fails here, before the work dir
    # (a previous training's checkpoints) is touched.
    cfg = rl_config(recipe)
    engine = rollout_engine(recipe)
    prompts = read_qa_rows(qa, limit or None, ("metadata", *recipe.method.row_columns))
    prepare_work_dir(Path(out_dir), {"recipe": resume_key(recipe), "limit": limit, **(fingerprint or {})},
                     {"policy": policy, "qa": qa, **(inputs or {})})
    tokenizer = AutoTokenizer.from_pretrained(policy)
    if is_finished(out_dir, cfg.steps):
        engine = ("hf", None)  # train_rl returns at once: no server to start (minutes) for no rollout
    with rollout_generators(recipe, tokenizer, policy, out_dir, engine) as generators:
        final = train_rl(policy, None, prompts, make_rollout_fn(recipe, tokenizer, env, generators), cfg, out_dir)
    if log_out is not None:
        # The running log lives next to the checkpoints (it must survive a kill); the declared
        # output is a copy made once training is complete.
        with atomic_path(log_out) as tmp:
            shutil.copyfile(Path(out_dir) / "train_log.jsonl", tmp)
    return final
