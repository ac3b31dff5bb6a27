"""Recipe + paths -> the Hydra overrides of `python -m verl.trainer.main_ppo` (a pure function).

Every RL setting of a recipe that verl can honour is mapped here, with its verl key; settings it
cannot honour are refused with the reason instead of being dropped silently:

    recipes.X.rl             verl key
    algorithm: grpo          algorithm.adv_estimator=grpo (ppo_clip here is critic-free and
                             batch-normalised: verl has no such estimator -> refused; remax would
                             be verl's remax and ppo, with a critic, verl's gae, but neither is
                             mapped yet -> refused)
    group_size               actor_rollout_ref.rollout.n
    batch_prompts            data.train_batch_size (prompts per step, as here)
    num_mini_batches         actor.ppo_mini_batch_size = batch_prompts / num_mini_batches (prompts)
    ppo_epochs               actor.ppo_epochs
    shuffle_mini_batches     actor.shuffle
    micro_batch_size         actor.ppo_micro_batch_size_per_gpu (+ the log-prob passes); None:
                             verl's dynamic batch size (tokens per GPU)
    clip_eps, clip_eps_high  actor.clip_ratio_low, actor.clip_ratio_high
    entropy_coeff            actor.entropy_coeff
    clip_ratio_c             actor.clip_ratio_c; None (no dual clip): NO_DUAL_CLIP, as verl cannot
                             switch it off and applies 3.0 by default
    kl_coef (> 0)            actor.use_kl_loss=true, kl_loss_coef, kl_loss_type=k3 (verl's k3 is
                             ours clamped to [-10, 10]); 0: no KL and no reference model
    loss_agg                 token-mean -> token-mean; grpo -> seq-mean-token-mean;
                             dr_grpo -> seq-mean-token-sum-norm (loss_scale_factor=max_response_len)
    scale_rewards            algorithm.norm_adv_by_std_in_grpo
    lr, warmup_steps, weight_decay, max_grad_norm   actor.optim.{lr, lr_warmup_steps, weight_decay, clip_grad}
    lr_scheduler             actor.optim.lr_scheduler_type (constant | cosine)
    steps                    trainer.total_training_steps (and enough epochs to reach it)
    checkpoint_every, keep_checkpoints   trainer.save_freq, trainer.max_actor_ckpt_to_keep
    seed                     data.seed
    temperature              actor_rollout_ref.rollout.temperature (= recipes.X.rollout.temperature)
    turn_advantage_weight    must be 0: verl's GRPO has one advantage per sequence -> refused
    filter_tied_groups       must be false: main_ppo keeps a tied group in the batch (its advantages
                             are 0 but it still counts in the loss's mean); verl's DAPO filter
                             (algorithm.filter_groups, v1 trainer) evicts and regenerates groups,
                             another recipe -> refused
    mixed_precision          not mapped: verl's FSDP runs bf16 compute by default
    logprob_chunk_tokens     not mapped: a memory setting of the local trainer's log-prob passes;
                             verl sizes its own
    padding_free             actor_rollout_ref.model.use_remove_padding (set when true)

`recipes.X.rl.verl` (a mapping `verl.key: value`) is appended last and replaces a generated key
of the same name: the escape hatch for GPU-specific knobs (tensor parallel size, memory
utilisation, offloading). Keys verl's config lacks need Hydra's `+` prefix there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragrl.errors import InputError

AGENT_NAME = "ragrl_agent"
# verl clamps the log-ratio to +-20 before its dual clip, so no ratio reaches e^20 ~ 4.9e8: a cap
# above that never binds, which is how a recipe without dual clip (Search-R1's fork, TRL) runs on it.
NO_DUAL_CLIP = 1e9
LOSS_AGG = {"token-mean": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
_PLAIN = re.compile(r"^[A-Za-z0-9_./:@+-]+$")


@dataclass(frozen=True)
class VerlPaths:
    train_parquet: Path
    val_parquet: Path
    policy: Path  # the HF checkpoint RL starts from (SFT merged, or the base policy)
    checkpoints: Path  # trainer.default_local_dir: global_step_N/actor/... (resumable)
    agent_loop_config: Path  # the YAML list naming our agent loop and its settings
    reward_module: Path  # the file holding compute_score (ragrl/verl/reward.py)


@dataclass(frozen=True)
class VerlCluster:
    nnodes: int = 1
    gpus_per_node: int = 1
    rollout_engine: str = "vllm"


def hydra_value(value: Any) -> str:
    """A Python value in Hydra's override grammar (strings quoted when they need it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.match(text) and text not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def build_overrides(recipe, paths: VerlPaths, *, n_prompts: int, max_prompt_length: int,
                    cluster: VerlCluster = VerlCluster()) -> list[str]:
    """The full override list for `verl.trainer.main_ppo`, in a stable order.

    `recipe` is a `ragrl.recipe.Recipe`; its `rl` part is checked through `RLConfig` first, so a
    verl run rejects exactly the values a local run rejects. `n_prompts` (rows of the training
    parquet) sets the epoch count so that `steps` is reached; `max_prompt_length` is the longest
    tokenized prompt of that parquet (verl pads every prompt to it and refuses longer ones).
    """
    from ragrl.recipe import rl_config

    cfg = rl_config(recipe)
    problems = []
    if "verl" not in recipe.method.rl_backends:
        problems.append(f"method {recipe.env!r} does not support the verl backend (supported: {recipe.method.rl_backends})")
    if cfg.algorithm != "grpo":
        problems.append(f"algorithm {cfg.algorithm!r}: the verl backend runs GRPO only")
    if cfg.turn_advantage_weight:
        problems.append("turn_advantage_weight != 0: verl's GRPO has one advantage per sequence "
                        "(turn-level advantages need the local backend)")
    if cfg.filter_tied_groups:
        problems.append("filter_tied_groups: verl's main_ppo has no such filter (tied groups stay in the "
                        "loss's mean; DAPO's algorithm.filter_groups regenerates them instead): set it false")
    if cfg.batch_prompts % cfg.num_mini_batches:
        problems.append(f"batch_prompts {cfg.batch_prompts} is not divisible by num_mini_batches {cfg.num_mini_batches}")
    if n_prompts < cfg.batch_prompts:
        problems.append(f"{n_prompts} training prompts are fewer than batch_prompts {cfg.batch_prompts} "
                        "(verl drops incomplete batches)")
    if max_prompt_length < 1:
        problems.append("max_prompt_length must be >= 1")
    if problems:
        raise InputError(f"recipes.{recipe.name}.rl (backend verl): " + "; ".join(problems))

    rollout = recipe.rollout
    max_response = rollout.max_response_tokens
    steps_per_epoch = n_prompts // cfg.batch_prompts
    actor = "actor_rollout_ref.actor"
    out: dict[str, Any] = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": cfg.scale_rewards,
        "algorithm.use_kl_in_reward": False,
        # data: our parquet, prompts already chat messages (return_raw_chat is verl's default)
        "data.train_files": str(paths.train_parquet),
        "data.val_files": str(paths.val_parquet),
        "data.train_batch_size": cfg.batch_prompts,
        "data.max_prompt_length": max_prompt_length,
        "data.max_response_length": max_response,
        "data.filter_overlong_prompts": False,  # the launcher measured every prompt: none is too long
        "data.truncation": "error",
        "data.seed": cfg.seed,
        # model and actor
        "actor_rollout_ref.model.path": str(paths.policy),
        "actor_rollout_ref.model.trust_remote_code": False,
        f"{actor}.optim.lr": cfg.lr,
        f"{actor}.optim.lr_warmup_steps": cfg.warmup_steps if cfg.warmup_steps else -1,
        f"{actor}.optim.weight_decay": cfg.weight_decay,
        f"{actor}.optim.lr_scheduler_type": cfg.lr_scheduler,
        f"{actor}.optim.clip_grad": cfg.max_grad_norm,
        f"{actor}.ppo_mini_batch_size": cfg.batch_prompts // cfg.num_mini_batches,
        f"{actor}.ppo_epochs": cfg.ppo_epochs,
        f"{actor}.shuffle": cfg.shuffle_mini_batches,
        f"{actor}.clip_ratio_low": cfg.clip_eps,
        f"{actor}.clip_ratio_high": cfg.clip_high,
        f"{actor}.clip_ratio_c": NO_DUAL_CLIP if cfg.clip_ratio_c is None else cfg.clip_ratio_c,
        f"{actor}.loss_agg_mode": LOSS_AGG[cfg.loss_agg],
        f"{actor}.entropy_coeff": cfg.entropy_coeff,
        f"{actor}.use_kl_loss": cfg.kl_coef > 0,
        f"{actor}.kl_loss_coef": cfg.kl_coef,
        f"{actor}.kl_loss_type": "k3",
    }
    if cfg.padding_free:
        out["actor_rollout_ref.model.use_remove_padding"] = True
    if cfg.loss_agg == "dr_grpo":
        out[f"{actor}.loss_scale_factor"] = cfg.max_response_len or max_response
    if cfg.micro_batch_size is not None:
        for key in (f"{actor}.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
            out[key] = cfg.micro_batch_size
    else:
        out[f"{actor}.use_dynamic_bsz"] = True
        out[f"{actor}.ppo_max_token_len_per_gpu"] = max(16384, 2 * (max_prompt_length + max_response))
    out.update({
        # rollout: our agent loop on verl's inference servers
        "actor_rollout_ref.rollout.name": cluster.rollout_engine,
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": cfg.group_size,
        "actor_rollout_ref.rollout.temperature": rollout.temperature,
        "actor_rollout_ref.rollout.top_p": rollout.top_p,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(paths.agent_loop_config),
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_NAME,
        # reward: ours, through verl's custom-reward loader; weights and env as reward_kwargs
        "reward.custom_reward_function.path": str(paths.reward_module),
        "reward.custom_reward_function.name": "compute_score",
        "+reward.custom_reward_function.reward_kwargs": {"weights": dict(recipe.reward), "env": recipe.env,
                                                        "plugin": recipe.plugin or ""},
        # verl's naive reward-loop manager merges the agent loop's extra_fields into extra_info:
        # our reward reads the turn record from there (ragrl.verl.reward), so it is pinned
        # rather than left to a default another verl release may change.
        "reward.reward_manager.source": "register",
        "reward.reward_manager.name": "naive",
        # trainer: steps, checkpoints (resumed automatically after a kill), logs, cluster shape
        "trainer.total_training_steps": cfg.steps,
        "trainer.total_epochs": max(1, math.ceil(cfg.steps / steps_per_epoch)),
        "trainer.save_freq": cfg.checkpoint_every,
        "trainer.max_actor_ckpt_to_keep": cfg.keep_checkpoints,
        "trainer.resume_mode": "auto",
        "trainer.default_local_dir": str(paths.checkpoints),
        "trainer.test_freq": -1,  # evaluation is the workflow's eval rule, on the merged model
        "trainer.val_before_train": False,
        "trainer.logger": ["console", "file"],
        "trainer.project_name": "ragrl",
        "trainer.experiment_name": recipe.name,
        "trainer.nnodes": cluster.nnodes,
        "trainer.n_gpus_per_node": cluster.gpus_per_node,
    })
    for key, value in dict(recipe.rl.get("verl") or {}).items():
        out.pop(key.lstrip("+"), None)
        out.pop("+" + key.lstrip("+"), None)
        out[key] = value
    return [f"{key}={hydra_value(value)}" for key, value in out.items()]
