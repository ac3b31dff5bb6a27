"""GRPO cross-check: ragrl's trainer (src/ragrl/train/rl.py) against TRL's GRPOTrainer (issue #35).

    HF_HUB_OFFLINE=1 PYTHONPATH=src .venv/bin/python scripts/grpo_crosscheck.py   # 16 seeds, 5-10 min

Both trainers train the same policy (one randomly initialised tiny Qwen2 model, built here once:
the same initial weights) on the same single-turn task with the same reward function, the same
prompts at every step (TRL's dataset is ragrl's prompt schedule written out in order and read
unshuffled), group size, constant learning rate, steps, loss aggregation (token mean over the
batch: ragrl's `token-mean`, TRL's `dapo`), std-scaled group advantages, clip epsilon, no KL
(TRL's beta 0, ragrl's kl_coef 0), one optimizer step per batch, AdamW, gradient clipping, max new
tokens and sampling (temperature 1, no top-k/top-p, the same stop ids).

Two comparisons:

* Sampling: each trainer samples its own completions. The random streams differ, so whether the
  reward curves "agree" is judged against the spread between seeds of one trainer.
* Lock step: ragrl's run of the first seed is recorded and its completions are handed to TRL
  (its `rollout_func` hook), so both trainers update on the very same samples; everything after
  sampling (rewards, advantages, log-probs, loss, clipping, optimizer) must then give the same
  per-step loss and gradient norm and, at the end, the same weights, up to float rounding. This
  is the sharp check: a different advantage or loss shows at step 1. The gradient norm catches
  what the weights cannot (Adam undoes a constant factor in the loss), the weights what the norm
  cannot (a change of direction). It is repeated for each loss aggregation ragrl offers, with a
  KL term to the initial policy and with two updates per batch (the only case where the clip
  acts) (`VARIANTS`), with ragrl's std epsilon set to TRL's (1e-4; ragrl's own is 1e-6, the one
  formula difference), next to two yardsticks: ragrl against itself in other micro-batches (float
  rounding alone) and ragrl against itself with the setting changed (what a setting silently
  ignored looks like).

The task is the one tests/rl_toy.py uses to show ragrl's trainer learning: a chat-templated user
turn of three random words; a completion scores 1.0 if it contains one of `n_targets` target
tokens. The random policy gives each ordinary token about 1/vocab, so with 16 targets and 6 new
tokens a step starts around 0.25 and GRPO raises it to about 0.85 in 30 steps; almost every group
has mixed rewards.

Writes `crosscheck.json` (settings, per-step mean reward, loss, gradient norm and clipped share per
trainer and seed, quarter means, a summary over seeds, the lock-step comparison), `crosscheck.csv`
(one row per trainer, seed, step) and `crosscheck.png` (the reward curves) to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import math
import os
import random
import re
import string
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's "experimental" notice, every run

import torch

REPO = Path(__file__).resolve().parents[1]
TRAINERS = ("ragrl", "trl")


@dataclass(frozen=True)
class Settings:
    steps: int = 30
    prompts_per_step: int = 4
    group_size: int = 8
    lr: float = 1e-3
    clip_eps: float = 0.2
    max_new_tokens: int = 6
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    # The task: `n_prompts` chat-templated user turns of three words; a completion scores 1.0 when
    # it contains one of `n_targets` token ids (drawn with `task_seed` among the ordinary tokens).
    n_prompts: int = 8
    n_targets: int = 16
    task_seed: int = 0
    threads: int = 1
    seeds: tuple[int, ...] = field(default=(0,))


def log(msg: str) -> None:
    print(f"[crosscheck] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the task

# The tiny policy of tests/rl_toy.py: randomly initialised, so every ordinary token starts near
# 1/vocab and a set of target tokens gives a success rate well below 1.
SPEC = dict(vocab_size=400, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=256,
            max_position_embeddings=256, seed=0)


def corpus(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lexicon = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 6))) for _ in range(300)]
    return [" ".join(rng.choice(lexicon) for _ in range(10)) + "." for _ in range(n)]


def build_policy(out_dir: Path) -> Path:
    from ragrl.toy.tiny_model import TinyModelSpec, build_tiny

    return build_tiny(corpus(), out_dir, TinyModelSpec(**SPEC))


def task_prompts(s: Settings, tokenizer) -> list[dict]:
    """The prompt pool: text (what TRL tokenizes), prompt_ids (what ragrl's rollout feeds)."""
    out = []
    for line in corpus()[: s.n_prompts]:
        messages = [{"role": "user", "content": " ".join(line.split()[:3])}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"])
        # TRL tokenizes the text column itself: it must come out as the ids ragrl samples after.
        if tokenizer(text=[text])["input_ids"][0] != ids:
            raise RuntimeError(f"{text!r} tokenizes differently as text than as a chat")
        out.append({"text": text, "prompt_ids": ids})
    return out


def target_tokens(s: Settings, tokenizer) -> frozenset[int]:
    special = set(tokenizer.all_special_ids)
    ordinary = [i for i in range(len(tokenizer)) if i not in special]
    return frozenset(random.Random(s.task_seed).sample(ordinary, s.n_targets))


def token_reward(completion_ids, targets: frozenset[int]) -> float:
    return float(any(int(t) in targets for t in completion_ids))


def schedule(s: Settings, n_pool: int, seed: int) -> list[list[int]]:
    """The pool indices of each step's prompts: ragrl's own schedule, which TRL is fed in order."""
    from ragrl.train.rl import prompt_indices

    return [prompt_indices(n_pool, s.prompts_per_step, step, seed) for step in range(1, s.steps + 1)]


# --------------------------------------------------------------------------- ragrl


def ragrl_rollout(s: Settings, targets: frozenset[int], record: list | None = None):
    """rollout_fn sampling as TRL's generate does: left-padded prompts, temperature `s.temperature`,
    no top-k/top-p, the generation config's stop ids (the first one kept, the rest cut).
    `record` collects each step's (prompt_ids, response_ids) pairs, in sample order."""
    from ragrl.train.rl import Sample

    def rollout(batch_prompts: list[dict], group_size: int, model, step: int) -> list[Sample]:
        pad = model.generation_config.pad_token_id
        stops = model.generation_config.eos_token_id
        stops = {stops} if isinstance(stops, int) else set(stops)
        width = max(len(p["prompt_ids"]) for p in batch_prompts)
        ids = torch.full((len(batch_prompts), width), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, p in enumerate(batch_prompts):
            ids[i, width - len(p["prompt_ids"]):] = torch.tensor(p["prompt_ids"])
            att[i, width - len(p["prompt_ids"]):] = 1
        out = model.generate(
            input_ids=ids.repeat_interleave(group_size, 0).to(model.device),
            attention_mask=att.repeat_interleave(group_size, 0).to(model.device),
            do_sample=True, temperature=s.temperature, top_k=0, top_p=1.0,
            max_new_tokens=s.max_new_tokens, pad_token_id=pad, eos_token_id=sorted(stops),
        )
        samples = []
        for row in range(out.shape[0]):
            group = row // group_size
            response = out[row, width:].tolist()
            for k, tok in enumerate(response):
                if tok in stops:
                    response = response[: k + 1]
                    break
            samples.append(Sample(
                prompt_ids=list(batch_prompts[group]["prompt_ids"]), response_ids=response,
                loss_mask=[1] * len(response), turn_index=[0] * len(response),
                reward=token_reward(response, targets), group=group,
            ))
        if record is not None:
            record.append([(s_.prompt_ids, s_.response_ids) for s_ in samples])
        return samples

    return rollout


def replay_rollout(record: list, targets: frozenset[int]):
    """rollout_fn handing back a recorded run's completions (step by step, rewards recomputed)
    after checking that the trainer asks for the recorded prompts."""
    from ragrl.train.rl import Sample

    def rollout(batch_prompts: list[dict], group_size: int, model, step: int) -> list[Sample]:
        recorded = record[step - 1]
        if [p for p, _ in recorded] != [p["prompt_ids"] for p in batch_prompts for _ in range(group_size)]:
            raise RuntimeError(f"step {step}: ragrl asked for other prompts than the recorded step's")
        return [Sample(prompt_ids=list(p), response_ids=list(c), loss_mask=[1] * len(c), turn_index=[0] * len(c),
                       reward=token_reward(c, targets), group=k // group_size) for k, (p, c) in enumerate(recorded)]

    return rollout


@contextlib.contextmanager
def advantage_eps(eps: float | None):
    """ragrl's group advantages with another std epsilon (TRL adds 1e-4 to the std, ragrl 1e-6)."""
    if eps is None:
        yield
        return
    from ragrl.train import advantages

    with mock.patch.object(advantages, "group_advantages", functools.partial(advantages.group_advantages, eps=eps)):
        yield


def run_ragrl(model_dir: Path, pool: list[dict], targets, s: Settings, seed: int, work: Path,
              record: list | None = None, replay: list | None = None, adv_eps: float | None = None,
              **overrides) -> dict:
    """ragrl's trainer: per-step mean reward, loss, gradient norm (from its train_log.jsonl) and the
    trained weights. `record` collects the run's samples; `replay` trains on a recorded run's
    samples instead of sampling; `adv_eps` and `overrides` (RLConfig fields) are for the lock-step
    check."""
    from safetensors.torch import load_file

    from ragrl.train.rl import LOG_NAME, RLConfig, train_rl

    cfg = RLConfig(**{
        **dict(algorithm="grpo", group_size=s.group_size, clip_eps=s.clip_eps, kl_coef=0.0, loss_agg="token-mean",
               scale_rewards=True, lr=s.lr, warmup_steps=0, weight_decay=0.0, steps=s.steps,
               batch_prompts=s.prompts_per_step, ppo_epochs=1, num_mini_batches=1, max_grad_norm=s.max_grad_norm,
               seed=seed, checkpoint_every=10**9, keep_checkpoints=1, temperature=s.temperature, log_entropy=False),
        **overrides,
    })
    rollout = replay_rollout(replay, targets) if replay is not None else ragrl_rollout(s, targets, record)
    with advantage_eps(adv_eps):
        final = train_rl(model_dir, None, pool, rollout, cfg, work)
    recs = [json.loads(line) for line in (work / LOG_NAME).read_text().splitlines()]
    return {"reward": [r["reward_mean"] for r in recs], "loss": [r["loss"] for r in recs],
            "grad_norm": [r["grad_norm"] or 0.0 for r in recs], "clip_frac": [r["clip_frac"] for r in recs],
            "weights": load_file(final / "model.safetensors")}


# --------------------------------------------------------------------------- TRL


def run_trl(model_dir: Path, pool: list[dict], targets, s: Settings, seed: int, work: Path,
            replay: list | None = None, **overrides) -> dict:
    """TRL's GRPOTrainer: per-step mean reward (recorded by the reward function, which TRL calls
    once a step, and checked against TRL's own log), loss and gradient norm (its log), the trained
    weights. `replay`: a recorded ragrl run whose completions TRL trains on instead of sampling;
    `overrides`: GRPOConfig fields (the lock-step check's variants)."""
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = [pool[i] for step in schedule(s, len(pool), seed) for i in step]
    dataset = Dataset.from_list([{"prompt": r["text"]} for r in rows])
    rewards: list[float] = []

    def reward(prompts, completions, completion_ids, **_):
        values = [token_reward(ids, targets) for ids in completion_ids]
        rewards.append(sum(values) / len(values))
        return values

    args = GRPOConfig(**{**dict(
        output_dir=str(work), seed=seed, data_seed=seed, use_cpu=True, bf16=False, fp16=False,
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, log_level="warning",
        max_steps=s.steps * overrides.get("num_iterations", 1), learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=s.max_grad_norm, optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        per_device_train_batch_size=s.prompts_per_step * s.group_size, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=1, num_generations=s.group_size,
        shuffle_dataset=False,  # the dataset already is ragrl's step-by-step prompt order
        beta=0.0, epsilon=s.clip_eps, loss_type="dapo", scale_rewards="group",
        max_completion_length=s.max_new_tokens, temperature=s.temperature, top_p=1.0, top_k=0,
        gradient_checkpointing=False, dataloader_num_workers=0,
    ), **overrides})
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer, rollout_func=_replayer(replay, tokenizer) if replay else None)
    trainer.train()
    # One RL step is `num_iterations` optimizer steps on one generation (ragrl's ppo_epochs); TRL
    # logs each, ragrl their mean.
    per = args.num_iterations
    hist = [h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
    if len(rewards) != s.steps or len(hist) != s.steps * per:
        raise RuntimeError(f"TRL made {len(rewards)} reward calls and logged {len(hist)} optimizer steps; "
                           f"{s.steps} RL steps of {per} asked for")
    # TRL's own logged reward (at each generation) is the same batch mean; a difference means a step
    # was not one batch.
    logged = [h["reward"] for h in hist[::per]]
    if any(abs(a - b) > 1e-5 for a, b in zip(rewards, logged)):
        raise RuntimeError(f"TRL's logged rewards {logged} differ from its reward calls' {rewards}")
    weights = {k: v.detach().clone() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}

    def per_rl_step(key: str) -> list[float]:
        return [sum(h[key] for h in hist[k : k + per]) / per for k in range(0, len(hist), per)]

    return {"reward": rewards, "loss": per_rl_step("loss"), "grad_norm": per_rl_step("grad_norm"),
            "clip_frac": per_rl_step("clip_ratio/region_mean"), "weights": weights}


def _replayer(replay: list, tokenizer):
    """TRL rollout_func returning a recorded run's completions, step by step, after checking that
    TRL asks for the same prompts in the same order."""
    steps = iter(replay)

    def rollout(prompts, trainer):
        step = next(steps)
        asked = tokenizer(text=list(prompts))["input_ids"]
        if [list(a) for a in asked] != [list(p) for p, _ in step]:
            raise RuntimeError("TRL asked for other prompts than the recorded step's")
        return {"prompt_ids": [list(p) for p, _ in step], "completion_ids": [list(c) for _, c in step],
                "logprobs": None}

    return rollout


# --------------------------------------------------------------------------- the comparison


def quarter_means(curve: list[float]) -> dict[str, float]:
    q = max(1, len(curve) // 4)
    return {"first_quarter": sum(curve[:q]) / q, "last_quarter": sum(curve[-q:]) / q}


def weight_distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> dict:
    """How far apart two trained weight sets are, relative to how far training moved the first:
    ||a - b|| / ||a - initial|| over all parameters (0: the same training; about 1 or more: unrelated
    updates), and the largest single difference."""
    keys = sorted(set(a) & set(b) & set(initial))
    if not keys:
        raise ValueError("the two weight sets share no parameter")
    diff = math.sqrt(sum(float((a[k].double() - b[k].double()).square().sum()) for k in keys))
    moved = math.sqrt(sum(float((a[k].double() - initial[k].double()).square().sum()) for k in keys))
    return {"relative_l2": diff / moved if moved else math.inf,
            "max_abs_diff": max(float((a[k] - b[k]).abs().max()) for k in keys), "parameters": len(keys)}


def compare_runs(a: dict, b: dict, initial: dict[str, torch.Tensor]) -> dict:
    """Two runs on the same samples: the largest per-step differences and the weight distance."""
    out: dict[str, Any] = {"clip_frac_mean": [sum(r["clip_frac"]) / len(r["clip_frac"]) for r in (a, b)]}
    for key in ("reward", "loss", "grad_norm"):
        out[f"{key}_max_abs_diff"] = max(abs(x - y) for x, y in zip(a[key], b[key]))
    out["grad_norm_max_rel_diff"] = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a["grad_norm"], b["grad_norm"]))
    out["weights"] = weight_distance(a["weights"], b["weights"], initial)
    return out


# The lock-step variants: loss aggregations (and advantage scalings) of ragrl and their TRL names,
# and the KL term to the initial policy. token-mean/dapo is also the sampling comparison's.
VARIANTS = ("token-mean", "grpo", "dr_grpo", "token-mean+kl", "token-mean-2epochs")
KL_COEF = 0.05  # large enough to move the weights visibly in a few steps, unlike the papers' 0.001


def variant_settings(name: str, s: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """(RLConfig fields, GRPOConfig fields) that mean the same loss aggregation and advantage scaling."""
    return {
        "token-mean": ({"loss_agg": "token-mean"}, {"loss_type": "dapo"}),
        "grpo": ({"loss_agg": "grpo"}, {"loss_type": "grpo"}),
        # Dr. GRPO: no std division, a constant normaliser of groups x the generation limit.
        "dr_grpo": ({"loss_agg": "dr_grpo", "scale_rewards": False, "max_response_len": s.max_new_tokens},
                    {"loss_type": "dr_grpo", "scale_rewards": "none"}),
        # k3 KL to the initial policy inside the per-token loss, as GRPO and verl's low_var_kl have it.
        # TRL 1.16 multiplies it by the importance ratio by default (use_bias_correction_kl, from
        # DeepSeek-V3.2), which adds k3 * grad(log p) to the gradient even on-policy: another
        # estimator, compared separately (`kl_trl_default`).
        "token-mean+kl": ({"loss_agg": "token-mean", "kl_coef": KL_COEF},
                          {"loss_type": "dapo", "beta": KL_COEF, "use_bias_correction_kl": False}),
        # Two updates per batch: on the second the ratio leaves 1 and the clip acts (at one update
        # per batch it never does, so this is the only variant that tests clip epsilon).
        "token-mean-2epochs": ({"loss_agg": "token-mean", "ppo_epochs": 2}, {"loss_type": "dapo", "num_iterations": 2}),
    }[name]


def lockstep(model_dir: Path, pool: list[dict], targets, s: Settings, seed: int, ours: dict, record: list,
             work: Path, variants: tuple[str, ...] = VARIANTS, extras: bool = True) -> dict:
    """The recorded ragrl run `ours` (of `seed`, token-mean) against trainers fed its samples:

    * `floor`: ragrl again, in micro-batches of one group: the same computation summed in another
      order, so its distance is what float rounding alone gives;
    * `ragrl_vs_trl`: TRL, token-mean/dapo, as shipped;
    * per variant (loss aggregation, advantage scaling), ragrl with TRL's std epsilon in the
      advantages (1e-4 instead of 1e-6) against TRL with the same variant: what remains once the
      one known formula difference is matched;
    * `token-mean_vs_<variant>`: ragrl token-mean against ragrl with the variant, the distance a
      trainer that silently ignored the setting would show (how sharp the check is);
    * with `extras`, `kl_trl_default`: ragrl's KL variant against TRL's default KL (times the
      importance ratio), and `clip_ignored`: ragrl's two-epoch variant against itself without
      clipping (what a clip epsilon that did nothing would look like).
    """
    from safetensors.torch import load_file

    initial = load_file(model_dir / "model.safetensors")
    out: dict = {"seed": seed}
    floor = run_ragrl(model_dir, pool, targets, s, seed, work / "floor", replay=record, micro_batch_size=s.group_size)
    out["floor"] = compare_runs(ours, floor, initial)
    for name in variants:
        ragrl_over, trl_over = variant_settings(name, s)
        theirs = run_trl(model_dir, pool, targets, s, seed, work / f"trl_{name}", replay=record, **trl_over)
        mine = run_ragrl(model_dir, pool, targets, s, seed, work / f"ragrl_{name}", replay=record,
                         adv_eps=TRL_ADV_EPS, **ragrl_over)
        out[f"{name}_trl_eps"] = compare_runs(mine, theirs, initial)
        if name == "token-mean":
            out["ragrl_vs_trl"] = compare_runs(ours, theirs, initial)
            out["per_step"] = {"ragrl": _curves(ours), "trl": _curves(theirs)}
        else:
            out[f"token-mean_vs_{name}"] = compare_runs(ours, mine, initial)
        if name == "token-mean+kl" and extras:
            biased = run_trl(model_dir, pool, targets, s, seed, work / "trl_kl_default", replay=record,
                             **{**trl_over, "use_bias_correction_kl": True})
            out["kl_trl_default"] = compare_runs(mine, biased, initial)
        if name == "token-mean-2epochs" and extras:
            unclipped = run_ragrl(model_dir, pool, targets, s, seed, work / "ragrl_unclipped", replay=record,
                                  adv_eps=TRL_ADV_EPS, **{**ragrl_over, "clip_eps": 1e9})
            out["clip_ignored"] = compare_runs(mine, unclipped, initial)
    return out


TRL_ADV_EPS = 1e-4  # trl/trainer/grpo_trainer.py: advantages / (std_rewards + 1e-4)


def _curves(run: dict) -> dict[str, list[float]]:
    return {k: run[k] for k in ("reward", "loss", "grad_norm", "clip_frac")}


def summary(curves: dict[str, dict[str, dict[str, list[float]]]]) -> dict:
    """Per trainer: mean and standard deviation over seeds of the first- and last-quarter mean reward
    and of the whole run's mean; and the trainers' difference in units of its standard error."""
    out: dict = {}
    for t, by_seed in curves.items():
        stats = {}
        for name, pick in (("first_quarter", lambda c: quarter_means(c)["first_quarter"]),
                           ("last_quarter", lambda c: quarter_means(c)["last_quarter"]),
                           ("all_steps", lambda c: sum(c) / len(c))):
            values = [pick(c["reward"]) for c in by_seed.values()]
            mean = sum(values) / len(values)
            sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
            stats[name] = {"mean": mean, "sd": sd, "n": len(values)}
        out[t] = stats
    if len(out) == 2:
        (ta, a), (tb, b) = out.items()
        out["difference"] = {}
        for name in a:
            d = a[name]["mean"] - b[name]["mean"]
            se = (math.sqrt(a[name]["sd"] ** 2 / a[name]["n"] + b[name]["sd"] ** 2 / b[name]["n"])
                  if a[name]["sd"] is not None and b[name]["sd"] is not None else None)
            out["difference"][name] = {f"{ta}_minus_{tb}": d, "standard_error": se,
                                       "z": d / se if se else None}
    return out


def crosscheck(s: Settings, out_dir: Path, trainers=TRAINERS, lockstep_check: bool = True,
               lockstep_extras: bool = True, write: bool = True) -> dict:
    """Every trainer on every seed of `s`, sampling on its own, then (`lockstep_check`) the lock-step
    replay of ragrl's first-seed run (`lockstep_extras`: see `lockstep`); returns the results and
    (`write`) writes them to out_dir."""
    import transformers

    if lockstep_check and "ragrl" not in trainers:
        raise ValueError("the lock-step check replays ragrl's run: keep ragrl among the trainers")
    torch.set_num_threads(s.threads)
    curves: dict[str, dict[str, dict[str, list[float]]]] = {t: {} for t in trainers}
    times: dict[str, dict[str, float]] = {t: {} for t in trainers}
    with tempfile.TemporaryDirectory(prefix="grpo_crosscheck_") as tmp:
        tmp = Path(tmp)
        model_dir = build_policy(tmp / "policy")
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        pool, targets = task_prompts(s, tokenizer), target_tokens(s, tokenizer)
        record: list = []
        recorded = None
        for seed in s.seeds:
            for name in trainers:
                t0 = time.perf_counter()
                if name == "ragrl":
                    keep = lockstep_check and recorded is None
                    run = run_ragrl(model_dir, pool, targets, s, seed, tmp / f"{name}_{seed}",
                                    record=record if keep else None)
                    recorded = run if keep else recorded
                else:
                    run = run_trl(model_dir, pool, targets, s, seed, tmp / f"{name}_{seed}")
                times[name][str(seed)] = round(time.perf_counter() - t0, 1)
                curves[name][str(seed)] = _curves(run)
                q = quarter_means(run["reward"])
                log(f"{name} seed {seed}: mean reward {q['first_quarter']:.3f} in the first quarter, "
                    f"{q['last_quarter']:.3f} in the last ({times[name][str(seed)]} s)")
        locked = None
        if lockstep_check:
            locked = lockstep(model_dir, pool, targets, s, s.seeds[0], recorded, record, tmp / "lockstep",
                              extras=lockstep_extras)
            for pair, c in locked.items():
                if not isinstance(c, dict) or "weights" not in c:
                    continue
                log(f"lock step {pair}: grad norms {c['grad_norm_max_rel_diff']:.1e} apart (relative), "
                    f"weights {c['weights']['relative_l2']:.1e} of the update apart")
    result = {
        "settings": asdict(s),
        "targets": sorted(targets),
        "date": time.strftime("%Y-%m-%d"),
        "versions": _versions(),
        "per_step": curves,
        "quarters": {t: {seed: quarter_means(c["reward"]) for seed, c in by_seed.items()}
                     for t, by_seed in curves.items()},
        "summary": summary(curves),
        "lockstep": locked,
        "wall_s": times,
    }
    if write:
        write_outputs(result, out_dir)
    return result


def write_outputs(result: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "crosscheck.json").write_text(compact_json(result) + "\n")
    with open(out_dir / "crosscheck.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["trainer", "seed", "step", "mean_reward", "loss", "grad_norm"])
        for t, by_seed in result["per_step"].items():
            for seed, c in by_seed.items():
                w.writerows([t, seed, k + 1, f"{r:.6f}", f"{l:.6g}", f"{g:.6g}"]
                            for k, (r, l, g) in enumerate(zip(c["reward"], c["loss"], c["grad_norm"])))
    plot(result, out_dir / "crosscheck.png")


def compact_json(obj: Any) -> str:
    """JSON with floats to 6 significant digits and lists of numbers on one line: the per-step
    curves are most of the file."""

    def rounded(x: Any) -> Any:
        if isinstance(x, float):
            return float(f"{x:.6g}")
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [rounded(v) for v in x]
        return x

    text = json.dumps(rounded(obj), indent=1)
    return re.sub(r"\[\s+([-+0-9.eE,\s]+?)\s+\]", lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                  text)


def _versions() -> dict[str, str]:
    import transformers
    import trl

    return {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"ragrl": "tab:blue", "trl": "tab:orange"}
    fig, ax = plt.subplots(figsize=(7, 4))
    for t, by_seed in result["per_step"].items():
        curves = [c["reward"] for c in by_seed.values()]
        for curve in curves:
            ax.plot(range(1, len(curve) + 1), curve, color=colours.get(t), alpha=0.25, lw=0.8)
        mean = [sum(v) / len(v) for v in zip(*curves)]
        ax.plot(range(1, len(mean) + 1), mean, color=colours.get(t), lw=2,
                label=f"{t}: mean of {len(curves)} seed{'s' * (len(curves) > 1)} (thin: each seed)")
    s = result["settings"]
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward of the step's samples")
    ax.set_title(f"GRPO on the toy task ({s['prompts_per_step']} prompts x {s['group_size']} samples, "
                 f"lr {s['lr']:g}): ragrl vs TRL {result['versions']['trl']}", fontsize=9)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs/figures/grpo_crosscheck")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(16)))
    ap.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    ap.add_argument("--no-lockstep", action="store_true", help="skip the lock-step replay of the first seed")
    for f in Settings.__dataclass_fields__.values():
        if f.name != "seeds":
            ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = ap.parse_args(argv)
    values = {k: getattr(args, k) for k in Settings.__dataclass_fields__ if k != "seeds"}
    s = Settings(**values, seeds=tuple(args.seeds))
    result = crosscheck(s, args.out, tuple(args.trainers), lockstep_check=not args.no_lockstep)
    json.dump({"summary": result["summary"],
               "lockstep": {k: v for k, v in (result["lockstep"] or {}).items() if k != "per_step"}},
              sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
