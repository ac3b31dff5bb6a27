"""The typed settings of the training and rollout stages, standard library only.

A recipe's `rollout`, `sft` and `rl` sections map onto these dataclasses key for key. They live
here, not next to the code that uses them, so that the workflow (`rules/common.smk`) can check a
whole recipe before any job starts without importing torch, and so that the schema, the
validation and the stages read one list of keys (tests/test_recipe.py checks the schema against
these fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# RL: advantage estimators and loss aggregations the core implements (ragrl.train.losses).
# grpo and ppo_clip are critic-free; ppo trains a value model (critic) and takes GAE advantages.
ALGORITHMS = ("grpo", "ppo_clip", "ppo")
# k3: Schulman's low-variance estimator (the KL loss term, verl's low_var_kl); k1: logp - ref_logp
# (verl's algorithm.kl_penalty "kl", what Search-R1's and RAG-R1's PPO put into the reward).
KL_ESTIMATORS = ("k3", "k1")
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "grpo", "dr_grpo")
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class RolloutConfig:
    max_turns: int = 4  # tool turns; one forced answer turn may follow
    max_turn_tokens: int = 512
    max_response_tokens: int = 2048
    max_context_tokens: int = 8192
    max_obs_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1  # samples per prompt (a GRPO group)
    seed: int | None = 0
    forced_answer_prefill: bool = True
    # Prompt text with {question} (and {max_queries}) placeholders; None: the Search-R1 style
    # default of the environment (protocol.DEFAULT_INSTRUCTION / DEFAULT_MULTI_QUERY_INSTRUCTION).
    instruction: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_turn_tokens", "max_response_tokens", "max_context_tokens", "max_obs_tokens", "n"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name}={getattr(self, name)} must be >= 1")
        if self.max_turns < 0:
            raise ValueError(f"rollout.max_turns={self.max_turns} must be >= 0")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"rollout temperature={self.temperature} must be >= 0 and top_p={self.top_p} in (0, 1]")


# Vocabulary size from which SFTArgs.fused_lm_head=None takes TRL's fused LM head (Qwen2.5: 151,936;
# Llama 3: 128,256; the tiny default: 2,000).
FUSED_LM_HEAD_MIN_VOCAB = 32_768


@dataclass(frozen=True)
class SFTArgs:
    epochs: float = 1.0
    max_steps: int = -1  # > 0 overrides epochs
    lr: float = 1e-5
    batch_size: int = 8  # per device
    grad_accum: int = 1
    seed: int = 0
    warmup_steps: float = 0.0  # an int: steps; a float in [0, 1): share of all steps
    weight_decay: float = 0.0
    lr_scheduler: str = "cosine"
    max_grad_norm: float = 1.0
    max_length: int | None = None  # None: never truncate (TRL's default of 1024 would)
    log_every: int = 10
    bf16: bool | None = None  # None: on when a CUDA device supports it
    gradient_checkpointing: bool = False
    # Batches of similar lengths (transformers' LengthGroupedSampler): rows are padded to their
    # batch's longest, so random batches of trajectories of 100-800 tokens spend a quarter to a third
    # of the compute on padding. Off by default, as in transformers: where length follows the kind
    # of example (1-hop vs multi-hop trajectories), one-kind batches can train worse (config.yaml).
    group_by_length: bool = False
    # TRL's SFTTrainer computes the loss with its fused, tiled LM head, which never builds the
    # (tokens x vocab) logits: that saves gigabytes at a 150k vocabulary, but at a few thousand its
    # tile loop costs more than the logits (the default's 2,000-token vocabulary: 1.31-1.42x slower
    # per step, docs/BENCHMARKS.md). None: fused above FUSED_LM_HEAD_MIN_VOCAB tokens, plain logits below.
    fused_lm_head: bool | None = None
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = field(default=DEFAULT_LORA_TARGETS)

    def __post_init__(self) -> None:
        for name in ("lr", "batch_size", "grad_accum", "log_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sft.{name}={getattr(self, name)} must be > 0")
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ValueError("sft needs epochs > 0 or max_steps > 0")
        if self.lora and (self.lora_r <= 0 or not self.lora_target_modules):
            raise ValueError("LoRA needs lora_r > 0 and at least one target module")


@dataclass
class RLConfig:
    # grpo: group-normalised advantages; ppo_clip: batch-normalised (no critic); ppo: a learned
    # critic and GAE advantages (docs/RL.md)
    algorithm: str = "grpo"
    group_size: int = 4  # samples per prompt
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # None = clip_eps; larger = DAPO's clip-higher
    kl_coef: float = 0.0  # 0 skips the reference model entirely
    kl_estimator: str = "k3"  # k3 | k1 (k1 only in the reward: as a loss its gradient is not the KL's)
    loss_agg: str = "token-mean"  # token-mean | grpo | dr_grpo
    scale_rewards: bool = True  # False: do not divide advantages by the std (Dr. GRPO)
    max_response_len: int | None = None  # dr_grpo's constant normaliser (the generation limit)
    lr: float = 1e-6
    warmup_steps: int = 0  # linear LR warm-up, counted in RL steps
    weight_decay: float = 0.0
    steps: int = 100
    batch_prompts: int = 8  # prompts per step over all processes
    ppo_epochs: int = 1
    num_mini_batches: int = 1  # optimizer steps per epoch
    micro_batch_size: int | None = None  # sequences per forward pass (gradient accumulation); None = whole mini-batch
    max_grad_norm: float = 1.0
    seed: int = 0
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    turn_advantage_weight: float = 0.0  # w in A = w * A_turn + A_global
    temperature: float = 1.0  # must equal the rollout's sampling temperature: log-probs are of softmax(logits / T)
    mixed_precision: str = "no"  # "no" | "bf16" (fills DeepSpeed's "auto" bf16 switch)
    log_entropy: bool = True  # costs a softmax over the vocabulary at every response position in the no-grad pass
    # Response positions whose logits exist at once: the LM head, log-softmax and gather run on
    # this many positions at a time, checkpointed in the update (docs/RL.md, "Memory"); 0 = the
    # micro-batch's [rows, length, vocabulary] logits at once.
    logprob_chunk_tokens: int = 1024
    # DAPO's / HARR's filter: groups whose scalar rewards all tie (zero advantage) are left out of
    # the update (their tokens get no loss and do not count in its normaliser); a step where every
    # group ties makes no update. Their share is logged either way (`tied_group_share`).
    filter_tied_groups: bool = False
    # algorithm ppo only, under verl's names (algorithm.gamma / lam / use_kl_in_reward,
    # critic.cliprange_value, critic.optim.lr); the defaults are verl's.
    gamma: float = 1.0  # discount per policy token (observation tokens are skipped, not discounted)
    lam: float = 1.0  # GAE lambda
    cliprange_value: float = 0.5  # the critic's value clip around the values it predicted at rollout
    critic_lr: float = 1e-5
    critic_warmup_steps: int = 0  # linear warm-up of critic_lr, in RL steps (verl: lr_warmup_steps_ratio x steps)
    # True: -kl_coef * KL per policy token is added to the token rewards (PPO-RLHF, verl's
    # use_kl_in_reward with a fixed kl_ctrl); False: the KL is a loss term (the GRPO way).
    use_kl_in_reward: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.algorithm not in ALGORITHMS:
            problems.append(f"algorithm {self.algorithm!r} not in {ALGORITHMS}")
        if self.kl_estimator not in KL_ESTIMATORS:
            problems.append(f"kl_estimator {self.kl_estimator!r} not in {KL_ESTIMATORS}")
        if self.kl_estimator == "k1" and not self.use_kl_in_reward:
            problems.append("kl_estimator 'k1' needs use_kl_in_reward (as a loss term k1 has a zero-mean gradient)")
        if self.use_kl_in_reward and self.algorithm != "ppo":
            # The critic-free estimators take one scalar reward per sample; a per-token KL reward
            # needs the token-level returns only GAE computes.
            problems.append(f"use_kl_in_reward needs algorithm 'ppo' (not {self.algorithm!r})")
        if self.algorithm == "ppo":
            if self.turn_advantage_weight:
                problems.append("algorithm 'ppo' takes no turn_advantage_weight (GAE credits each token from the critic)")
            if self.filter_tied_groups:
                problems.append("algorithm 'ppo' takes no filter_tied_groups (a critic's advantages are not zero "
                                "when a group's rewards tie)")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            problems.append(f"gamma={self.gamma} and lam={self.lam} must be in [0, 1]")
        if self.cliprange_value <= 0 or self.critic_lr <= 0:
            problems.append("cliprange_value and critic_lr must be > 0")
        if self.critic_warmup_steps < 0:
            problems.append("critic_warmup_steps must be >= 0")
        if self.loss_agg not in LOSS_AGG_MODES:
            problems.append(f"loss_agg {self.loss_agg!r} not in {LOSS_AGG_MODES}")
        if self.mixed_precision not in ("no", "bf16"):
            problems.append(f"mixed_precision {self.mixed_precision!r} not in ('no', 'bf16')")
        positive = ("group_size", "steps", "batch_prompts", "ppo_epochs", "num_mini_batches", "checkpoint_every",
                    "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.logprob_chunk_tokens < 0:
            problems.append("logprob_chunk_tokens must be >= 0 (0 = no chunking)")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            problems.append("micro_batch_size must be >= 1 or None")
        if self.temperature <= 0:
            problems.append("temperature must be > 0")
        if problems:
            raise ValueError("invalid RLConfig: " + "; ".join(problems))

    @property
    def clip_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RLConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown RLConfig keys: {sorted(unknown)}")
        return cls(**values)


# --- HARR: RL for the retriever's query encoder (docs/HARR.md) ------------------------------------

# peft's "all-linear" skips only an LM output layer; a sentence-transformers BERT-style encoder has
# none, so it targets every projection.
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class EncoderTraining:
    """How the query encoder is trained: fully, or through LoRA adapters (HARR: r 32, alpha 64)."""

    lora: bool = True
    lora_r: int = 32
    lora_alpha: int = 64
    lora_target_modules: str | tuple[str, ...] = ALL_LINEAR
    max_length: int | None = None  # None: the model's own max_seq_length

    def __post_init__(self) -> None:
        if self.lora and (self.lora_r < 1 or self.lora_alpha <= 0 or not self.lora_target_modules):
            raise ValueError(f"LoRA needs lora_r >= 1, lora_alpha > 0 and target modules; got {self}")


@dataclass(frozen=True)
class RetrieverTrainConfig:
    """HARR's settings (their train_*_0.6b.sh): 100 steps of 16 questions x G 8, lr 1e-5 constant,
    clip 0.2, beta 0, alpha 0.05; k and K live with the environment."""

    steps: int = 100
    questions_per_step: int = 16
    group_size: int = 8
    lr: float = 1e-5
    clip_eps: float = 0.2
    alpha: float = 0.05
    max_grad_norm: float | None = 1.0
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "questions_per_step", "group_size", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"HARR training: {name}={getattr(self, name)} must be >= 1")
        if self.group_size < 2:
            raise ValueError("HARR training: group_size must be >= 2 (a group advantage needs a group)")
        if not (self.lr > 0 and self.alpha > 0 and self.clip_eps > 0):
            raise ValueError(f"HARR training: lr, alpha and clip_eps must be > 0 (got {self})")


@dataclass(frozen=True)
class HarrEnvironment:
    """The retrieval environment of HARR: pool K, k drawn, and the encoder's query text.

    `template` is the query prompt ("Instruct: {instruction}\\n{state}" for Qwen3-Embedding, "{state}"
    for a model trained without instructions such as all-MiniLM-L6-v2); `instruction` None takes the
    authors' instruction for the state kind (ragrl.retrieval.query_state.default_instruction).
    `generator_temperature` 0 decodes the frozen generator greedily, so an answer's F1 varies only
    with what the stochastic retrieval returned.
    """

    topk: int = 3
    pool_size: int = 30
    template: str = "Instruct: {instruction}\n{state}"
    instruction: str | None = None
    generator_temperature: float = 0.0
    rollout_batch_questions: int = 8  # questions per rollout call in the filter (G rollouts each)

    def __post_init__(self) -> None:
        if self.topk < 1 or self.pool_size < self.topk:
            raise ValueError(f"HARR environment: need 1 <= topk <= pool_size, got topk={self.topk}, "
                             f"pool_size={self.pool_size}")
        if "{state}" not in self.template:
            raise ValueError(f"HARR environment: template {self.template!r} has no {{state}} placeholder")
        if self.generator_temperature < 0 or self.rollout_batch_questions < 1:
            raise ValueError("HARR environment: generator_temperature must be >= 0 and rollout_batch_questions >= 1")
