"""The typed settings of the training and rollout stages, standard library only.

A recipe's `rollout`, `sft` and `rl` sections and HARR's `environment`, `encoder` and `train` map
onto these dataclasses key for key. They live here, not next to the code that uses them, so that
the workflow (`ragrl.workflow`) can check a whole recipe before any job starts without importing
torch.

Each setting is declared once, with `setting()`: its default, help text, bounds and choices. The
checks in `__post_init__` (`check_settings`) and the matching blocks of
config/schemas/config.schema.yaml (`schema_fragment`, written by scripts/gen_schema.py) are read
off that declaration; only checks across fields are written out by hand.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass, field, fields
from types import NoneType, UnionType
from typing import Any, ClassVar

from ragrl.errors import InputError

# RL: advantage estimators and loss aggregations the core implements (ragrl.train.losses).
# grpo, remax and ppo_clip are critic-free; ppo trains a value model (critic) and takes GAE advantages.
ALGORITHMS = ("grpo", "remax", "ppo_clip", "ppo")
# k3: Schulman's low-variance estimator (the KL loss term, verl's low_var_kl); k1: logp - ref_logp
# (verl's algorithm.kl_penalty "kl", what Search-R1's and RAG-R1's PPO put into the reward).
KL_ESTIMATORS = ("k3", "k1")
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "grpo", "dr_grpo")
MIXED_PRECISION = ("no", "bf16")
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_OPERATORS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def setting(default: Any = MISSING, *, help: str, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, choices: tuple | None = None) -> Any:
    """A dataclass field with its help text, bounds and choices, which `check_settings` and
    `schema_fragment` read. None passes the checks: where the annotation admits it, it means unset."""
    if (ge is not None and gt is not None) or (le is not None and lt is not None):
        raise TypeError("a setting takes at most one lower and one upper bound")
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    metadata: dict[str, Any] = {"help": help, **{k: v for k, v in bounds.items() if v is not None}}
    if choices is not None:
        metadata["choices"] = tuple(choices)
    return field(default=default, metadata=metadata)


def _rule(meta: typing.Mapping[str, Any]) -> str | None:
    """The bounds as the error message states them: `>= 1`, `> 0`, `in [0, 1]`, `in (0, 1]`."""
    low = next(((k, meta[k]) for k in ("ge", "gt") if k in meta), None)
    high = next(((k, meta[k]) for k in ("le", "lt") if k in meta), None)
    if low and high:
        return f"in {'[' if low[0] == 'ge' else '('}{low[1]}, {high[1]}{']' if high[0] == 'le' else ')'}"
    if low or high:
        op, bound = low or high
        return f"{_OPERATORS[op]} {bound}"
    return None


def _within(value: Any, meta: typing.Mapping[str, Any]) -> bool:
    return (("ge" not in meta or value >= meta["ge"]) and ("gt" not in meta or value > meta["gt"])
            and ("le" not in meta or value <= meta["le"]) and ("lt" not in meta or value < meta["lt"]))


def check_settings(settings: Any, *problems: str) -> None:
    """Raise InputError naming every value outside its setting's bounds or choices, as
    `rl.steps=0 must be >= 1`, followed by `problems` (the cross-field checks of the caller)."""
    key = type(settings).KEY
    found = []
    for f in fields(settings):
        value = getattr(settings, f.name)
        if value is None:
            continue
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            found.append(f"{key}.{f.name}={value!r} must be one of {choices}")
        rule = _rule(f.metadata)
        if rule is not None and not _within(value, f.metadata):
            found.append(f"{key}.{f.name}={value!r} must be {rule}")
    found.extend(problems)
    if found:
        raise InputError("; ".join(found))


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _json_type(hint: Any) -> dict[str, Any]:
    """The JSON-schema type of an annotation: int, float, bool, str, tuple[str, ...], their unions
    and `| None`."""
    members = typing.get_args(hint) if isinstance(hint, UnionType) else (hint,)
    types: list[str] = []
    items = None
    for member in members:
        if member is NoneType:
            types.append("null")
        elif typing.get_origin(member) is tuple:
            types.append("array")
            items = _json_type(typing.get_args(member)[0])
        else:
            types.append(_JSON_TYPES[member])
    out: dict[str, Any] = {"type": types[0] if len(types) == 1 else types}
    if items is not None:
        out["items"] = items
    return out


def schema_fragment(cls: type) -> dict[str, dict[str, Any]]:
    """The JSON-schema `properties` of a settings dataclass, key by key: type (from the annotation;
    `enum` instead where the setting has choices), bounds, description and default."""
    hints = typing.get_type_hints(cls)
    keywords = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    out = {}
    for f in fields(cls):
        meta = f.metadata
        if "choices" in meta:
            prop: dict[str, Any] = {"enum": list(meta["choices"])}
        else:
            prop = _json_type(hints[f.name])
        prop.update({keywords[k]: meta[k] for k in _OPERATORS if k in meta})
        prop["description"] = meta["help"]
        prop["default"] = list(f.default) if isinstance(f.default, tuple) else f.default
        out[f.name] = prop
    return out


@dataclass(frozen=True)
class RolloutConfig:
    KEY: ClassVar[str] = "rollout"

    max_turns: int = setting(4, ge=0, help="tool turns; one forced answer turn may follow")
    max_turn_tokens: int = setting(512, ge=1, help="generated tokens per turn")
    max_response_tokens: int = setting(2048, ge=1, help="generated + observation tokens")
    max_context_tokens: int = setting(8192, ge=1, help="prompt + response (context_overflow end), or the window a turn "
                                                       "is generated from (roll)")
    # Search-R1's, RAG-R1's and KG-R1's loops keep generating from the context's last
    # max_prompt_length tokens (_update_rolling_state) instead of ending the trajectory.
    context_overflow: str = setting("end", choices=("end", "roll"),
                                    help="a context past max_context_tokens: end the trajectory (end), or generate "
                                         "each later turn from its last max_context_tokens tokens (roll; the "
                                         "trajectory and its training sequence stay whole)")
    max_obs_tokens: int = setting(512, ge=1, help="one observation, closing tag kept")
    temperature: float = setting(1.0, ge=0, help="sampling temperature")
    top_p: float = setting(1.0, gt=0, le=1, help="nucleus sampling: the most likely tokens of this total probability")
    n: int = setting(1, ge=1, help="samples per prompt (a GRPO group; RL sets the group size)")
    seed: int | None = setting(0, help="sampling seed; null: unseeded")
    forced_answer_prefill: bool = setting(True, help="prefill <answer> in the forced answer turn")
    turn_limit_notice: bool = setting(True, help="the turn-limit notice before the forced answer turn (the authors' "
                                                 "Search-R1 and KG-R1 loops generate the last turn without one)")
    instruction: str | None = setting(
        None, help="prompt with {question} (and {max_queries}) placeholders; null: the environment's Search-R1 style "
                   "default (protocol.DEFAULT_INSTRUCTION / DEFAULT_MULTI_QUERY_INSTRUCTION)")
    system_prompt: str | None = setting(
        None, help="a system message before the user turn (the instruction then holds what the user turn says, "
                   "e.g. \"{question}\": KnowRL's prompt); null: the user turn alone")
    continue_user_turn: bool = setting(False, help="end the prompt after the user turn's text, with no assistant header "
                                                   "(apply_chat_template(continue_final_message=True), KnowRL's main.py); "
                                                   "false: the template's generation prompt")
    question_mark: bool = setting(False, help="strip each question and end it with \"?\" where it has none "
                                              "(Search-R1's and RAG-R1's data processing); false: as given")

    @property
    def context_limit(self) -> int | None:
        """The sequence length at which a trajectory ends (prompt + response), or None under
        `context_overflow: roll`, where the context is a window and only the response budget ends it."""
        return self.max_context_tokens if self.context_overflow == "end" else None

    def __post_init__(self) -> None:
        # A prefilled <answer> is what exempts the last turn from <think> (the turn record's
        # after_notice); without the notice that turn would fail every format check.
        check_settings(self, *(["forced_answer_prefill needs turn_limit_notice (a prefilled <answer> without the "
                                "notice before it)"] if self.forced_answer_prefill and not self.turn_limit_notice else []))


# Vocabulary size from which SFTArgs.fused_lm_head=None takes TRL's fused LM head (Qwen2.5: 151,936;
# Llama 3: 128,256; the tiny default: 2,000).
FUSED_LM_HEAD_MIN_VOCAB = 32_768


@dataclass(frozen=True)
class SFTArgs:
    KEY: ClassVar[str] = "sft"

    # No bound of its own: with max_steps > 0 epochs is ignored (the cross-field check below).
    epochs: float = setting(1.0, help="passes over the SFT data")
    max_steps: int = setting(-1, help="> 0 overrides epochs")
    lr: float = setting(1e-5, gt=0, help="learning rate")
    batch_size: int = setting(8, ge=1, help="per device")
    grad_accum: int = setting(1, ge=1, help="gradient accumulation steps")
    seed: int = setting(0, help="training seed (in a recipe, default: the recipe's seed)")
    warmup_steps: float = setting(0.0, ge=0, help="an int: steps; a float in [0, 1): share of all steps")
    weight_decay: float = setting(0.0, ge=0, help="AdamW weight decay")
    lr_scheduler: str = setting("cosine", help="transformers' lr_scheduler_type: cosine, linear, constant, ...")
    max_grad_norm: float = setting(1.0, gt=0, help="gradient clipping norm")
    max_length: int | None = setting(None, ge=1, help="null: never truncate (TRL's default of 1024 would)")
    log_every: int = setting(10, ge=1, help="log every N steps")
    bf16: bool | None = setting(None, help="null: on when a CUDA device supports it")
    gradient_checkpointing: bool = setting(False, help="recompute activations in the backward pass (less memory)")
    # Batches of similar lengths (transformers' LengthGroupedSampler): rows are padded to their
    # batch's longest, so random batches of trajectories of 100-800 tokens spend a quarter to a third
    # of the compute on padding. Off by default, as in transformers: where length follows the kind
    # of example (1-hop vs multi-hop trajectories), one-kind batches can train worse (config.yaml).
    group_by_length: bool = setting(False, help="batches of similar lengths (less padding)")
    # The same batches without padding: TRL's collator joins a batch into one row, and its
    # sequences stay apart (the loss equals the padded batch's to float rounding) by attending one
    # sequence at a time (ragrl.train.packed_attention; transformers' default, SDPA, would attend
    # over the whole row under a block-diagonal mask, quadratic in the row). Worth it for short,
    # uneven rows (KnowRL's: 60% of a padded batch was padding); Search-R1's trajectories (~500
    # tokens, batches of 8, 25% padding) train 1.1-1.3x faster per token (docs/BENCHMARKS.md).
    padding_free: bool = setting(False, help="join each batch into one unpadded row (short sequences)")
    # TRL's SFTTrainer computes the loss with its fused, tiled LM head, which never builds the
    # (tokens x vocab) logits: that saves gigabytes at a 150k vocabulary, but at a few thousand its
    # tile loop costs more than the logits (the default's 2,000-token vocabulary: 1.31-1.42x slower
    # per step, docs/BENCHMARKS.md).
    fused_lm_head: bool | None = setting(
        None, help=f"TRL's fused, tiled LM head for the loss (no full logits); null: on for vocabularies of "
                   f"{FUSED_LM_HEAD_MIN_VOCAB:,} tokens or more")
    lora: bool = setting(False, help="train LoRA adapters instead of every weight")
    lora_r: int = setting(16, ge=1, help="LoRA rank")
    lora_alpha: int = setting(32, ge=1, help="LoRA scaling alpha")
    lora_dropout: float = setting(0.0, ge=0, le=1, help="dropout on the LoRA path")
    lora_target_modules: tuple[str, ...] = setting(DEFAULT_LORA_TARGETS, help="module names LoRA adapts")

    def __post_init__(self) -> None:
        problems = []
        if self.max_steps <= 0 and self.epochs <= 0:
            problems.append("sft needs epochs > 0 or max_steps > 0")
        if self.lora and not self.lora_target_modules:
            problems.append("sft.lora needs lora_target_modules")
        check_settings(self, *problems)


@dataclass
class RLConfig:
    KEY: ClassVar[str] = "rl"

    # grpo: group-normalised advantages; remax: the reward of the policy's greedy rollout of the
    # same prompt as the baseline; ppo_clip: batch-normalised (no critic); ppo: a learned critic
    # and GAE advantages (docs/RL.md)
    algorithm: str = setting("grpo", choices=ALGORITHMS,
                             help="grpo, remax, ppo_clip: critic-free; ppo: a learned critic and GAE (docs/RL.md)")
    group_size: int = setting(4, ge=1, help="samples per prompt")
    clip_eps: float = setting(0.2, ge=0, help="PPO's clip of the probability ratio")
    clip_eps_high: float | None = setting(None, ge=0, help="DAPO clip-higher (larger than clip_eps); null: clip_eps")
    # verl applies dual clip (3.0) unless told otherwise; Search-R1's fork and TRL have none.
    clip_ratio_c: float | None = setting(None, gt=1, help="dual-clip PPO: where the advantage is negative the token "
                                                          "loss is capped at -A * clip_ratio_c (verl's clip_ratio_c, "
                                                          "3.0 there); null: no cap")
    kl_coef: float = setting(0.0, ge=0, help="KL weight; 0 skips the reference model entirely")
    entropy_coeff: float = setting(0.0, ge=0, help="entropy bonus: the loss minus entropy_coeff x the per-token "
                                                   "entropy, aggregated as the loss (verl's entropy_coeff)")
    # k1 only in the reward: as a loss its gradient is not the KL's.
    kl_estimator: str = setting("k3", choices=KL_ESTIMATORS,
                                help="k3: a KL loss term; k1 (verl's kl_penalty kl) only with use_kl_in_reward")
    loss_agg: str = setting("token-mean", choices=LOSS_AGG_MODES,
                            help="how token losses are averaged: over all tokens, per sequence (grpo), or by a "
                                 "constant (dr_grpo)")
    scale_rewards: bool = setting(True, help="false: do not divide advantages by the std (Dr. GRPO)")
    max_response_len: int | None = setting(None, ge=1, help="dr_grpo's constant normaliser (the generation limit)")
    lr: float = setting(1e-6, gt=0, help="learning rate")
    warmup_steps: int = setting(0, ge=0, help="linear LR warm-up, in RL steps")
    lr_scheduler: str = setting("constant", choices=("constant", "cosine"),
                                help="the policy's LR after the warm-up: constant, or transformers' and verl's cosine "
                                     "over the remaining steps (towards 0 after the last; the critic's stays constant, "
                                     "as verl's default)")
    weight_decay: float = setting(0.0, ge=0, help="AdamW weight decay")
    steps: int = setting(100, ge=1, help="RL steps")
    batch_prompts: int = setting(8, ge=1, help="prompts per step over all processes")
    ppo_epochs: int = setting(1, ge=1, help="passes over each step's rollouts")
    num_mini_batches: int = setting(1, ge=1, help="optimizer steps per epoch")
    shuffle_mini_batches: bool = setting(True, help="shuffle a step's rows before splitting them into mini-batches "
                                                    "(verl's actor.shuffle); false: split in rollout order, whole "
                                                    "groups together, as the verl forks' batch.split")
    micro_batch_size: int | None = setting(
        None, ge=1, help="sequences per forward pass (gradient accumulation); null: the whole mini-batch")
    max_grad_norm: float = setting(1.0, gt=0, help="gradient clipping norm")
    seed: int = setting(0, help="training seed (in a recipe, default: the recipe's seed)")
    checkpoint_every: int = setting(50, ge=1, help="steps between checkpoints")
    keep_checkpoints: int = setting(2, ge=1, help="checkpoints kept")
    turn_advantage_weight: float = setting(0.0, help="w in A = w * A_turn + A_global (methods with turn rewards)")
    # log-probs are of softmax(logits / T)
    temperature: float = setting(1.0, gt=0, help="must be the rollout's sampling temperature (in a recipe, "
                                                 "default: rollout.temperature)")
    mixed_precision: str = setting("no", choices=MIXED_PRECISION, help="bf16 fills DeepSpeed's 'auto' bf16 switch")
    log_entropy: bool = setting(True, help="log the policy's entropy (a softmax over the vocabulary at every response "
                                           "position, outside the gradient graph)")
    # The LM head, log-softmax and gather run on this many positions at a time, checkpointed in the
    # update (docs/RL.md, "Memory").
    logprob_chunk_tokens: int = setting(1024, ge=0, help="response positions whose logits exist at once in the "
                                                         "log-prob and loss passes; 0: a micro-batch's at once")
    # One unpadded row per micro-batch, attended per sequence (ragrl.train.packed_attention): a
    # step's rows differ by hundreds of tokens (one search or three), and padding made the update
    # and the reference scoring compute them all at the longest's length (docs/BENCHMARKS.md).
    padding_free: bool = setting(False, help="each micro-batch one unpadded row in the update and the log-prob "
                                             "passes (verl: use_remove_padding)")
    # DAPO's / HARR's filter: tied groups' tokens get no loss and do not count in its normaliser; a
    # step where every group ties makes no update. Their share is logged either way (`tied_group_share`).
    filter_tied_groups: bool = setting(False, help="leave groups whose rewards all tie out of the update (DAPO, HARR); with "
                                  "turn_advantage_weight, a group counts as tied only if its turn rewards tie too")
    # algorithm ppo only, under verl's names; the defaults are verl's.
    gamma: float = setting(1.0, ge=0, le=1, help="ppo: GAE discount per policy token (observation tokens are "
                                                 "skipped, not discounted; verl algorithm.gamma)")
    lam: float = setting(1.0, ge=0, le=1, help="ppo: GAE lambda (verl algorithm.lam)")
    cliprange_value: float = setting(0.5, gt=0, help="ppo: the critic's value clip around the values it predicted "
                                                     "at rollout (verl critic.cliprange_value)")
    critic_lr: float = setting(1e-5, gt=0, help="ppo: the critic's learning rate (verl critic.optim.lr)")
    critic_warmup_steps: int = setting(0, ge=0, help="ppo: linear warm-up of critic_lr, in RL steps")
    use_kl_in_reward: bool = setting(
        False, help="ppo: -kl_coef * KL per policy token in the token rewards (PPO-RLHF, verl's use_kl_in_reward "
                    "with a fixed kl_ctrl) instead of a KL loss term")

    def __post_init__(self) -> None:
        problems = []
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
        if self.algorithm == "ppo_clip" and self.filter_tied_groups:
            problems.append("algorithm 'ppo_clip' takes no filter_tied_groups (its advantages are normalised over "
                            "the batch, not the group: a group whose rewards tie still has a signal)")
        check_settings(self, *problems)

    @property
    def clip_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def greedy_baseline(self) -> bool:
        """Whether each sample needs its prompt's greedy reward (remax's baseline)."""
        return self.algorithm == "remax"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RLConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise InputError(f"unknown RLConfig keys: {sorted(unknown)}")
        return cls(**values)


# --- HARR: RL for the retriever's query encoder (docs/HARR.md) ------------------------------------

# peft's "all-linear" skips only an LM output layer; a sentence-transformers BERT-style encoder has
# none, so it targets every projection.
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class EncoderTraining:
    """How the query encoder is trained: fully, or through LoRA adapters (HARR: r 32, alpha 64)."""

    KEY: ClassVar[str] = "harr.encoder"

    lora: bool = setting(True, help="train LoRA adapters (false: every weight of the encoder)")
    lora_r: int = setting(32, ge=1, help="LoRA rank")
    lora_alpha: int = setting(64, gt=0, help="LoRA scaling alpha")
    lora_target_modules: str | tuple[str, ...] = setting(
        ALL_LINEAR, help=f"module names LoRA adapts, or {ALL_LINEAR} (every projection)")
    max_length: int | None = setting(None, help="longest query in tokens; null: the model's own max_seq_length")

    def __post_init__(self) -> None:
        problems = ["harr.encoder.lora needs lora_target_modules"] if self.lora and not self.lora_target_modules else []
        check_settings(self, *problems)


@dataclass(frozen=True)
class RetrieverTrainConfig:
    """HARR's settings (their train_*_0.6b.sh): 100 steps of 16 questions x G 8, lr 1e-5 constant,
    clip 0.2, beta 0, alpha 0.05; k and K live with the environment."""

    KEY: ClassVar[str] = "harr.train"

    steps: int = setting(100, ge=1, help="training steps")
    questions_per_step: int = setting(16, ge=1, help="questions per step")
    group_size: int = setting(8, ge=2, help="G: rollouts per question (a group advantage needs a group)")
    lr: float = setting(1e-5, gt=0, help="learning rate (constant)")
    clip_eps: float = setting(0.2, gt=0, help="PPO's clip of the probability ratio")
    alpha: float = setting(0.05, gt=0, help="temperature of the Plackett-Luce draw over the pool's scores")
    # TRL 0.18.1's default loss_type "bnpo" is the mean over the batch's retrieval steps: token-mean.
    loss_agg: str = setting("grpo", choices=("grpo", "token-mean"),
                            help="grpo: mean over each trajectory's retrieval steps, then over trajectories; "
                                 "token-mean: over all retrieval steps of the batch (TRL's bnpo)")
    max_grad_norm: float | None = setting(1.0, help="gradient clipping norm; null: no clipping")
    checkpoint_every: int = setting(10, ge=1, help="steps between checkpoints")
    keep_checkpoints: int = setting(2, ge=1, help="checkpoints kept")
    seed: int = setting(0, help="training seed")

    def __post_init__(self) -> None:
        check_settings(self)


# What a completed hop's "answer" holds in HARR's history-aware state (ragrl.train.retriever_rollout).
HOP_ANSWERS = ("think", "none")


@dataclass(frozen=True)
class HarrEnvironment:
    """The retrieval environment of HARR: pool K, k drawn, and the encoder's query text.

    `template` is the query prompt ("Instruct: {instruction}\\n{state}" for Qwen3-Embedding, "{state}"
    for a model trained without instructions such as all-MiniLM-L6-v2); `instruction` None takes the
    authors' instruction for the state kind (ragrl.retrieval.query_state.default_instruction).
    `generator_temperature` 0 decodes the frozen generator greedily, so an answer's F1 varies only
    with what the stochastic retrieval returned.
    """

    KEY: ClassVar[str] = "harr.environment"

    topk: int = setting(3, ge=1, help="k: passages drawn from the pool for the generator (at most pool_size)")
    pool_size: int = setting(30, help="K: the encoder's top passages that k are drawn from")
    template: str = setting("Instruct: {instruction}\n{state}",
                            help="the encoder's query text, with {state} (and {instruction})")
    instruction: str | None = setting(None, help="null: the authors' instruction for the state kind")
    generator_temperature: float = setting(0.0, ge=0, help="the frozen generator's sampling temperature; 0: greedy")
    rollout_batch_questions: int = setting(8, ge=1, help="questions per rollout call in the filter (G rollouts each)")
    hop_answer: str = setting("think", choices=HOP_ANSWERS,
                              help="a completed hop's \"answer\" in the history-aware state: the generator's <think> "
                                   "text before that search (the authors' Search-R1 loop), or none (null)")
    # HARR's generator retrieves once with the question when a trajectory never searched, so every
    # trajectory trains the encoder (generator.py, search_r1_generate).
    forced_retrieval: bool = setting(False, help="a training trajectory without a search gets one retrieval step: the "
                                                 "question as the query, its top k (HARR's generator)")

    def __post_init__(self) -> None:
        problems = []
        if self.pool_size < self.topk:
            problems.append(f"harr.environment needs topk <= pool_size, got topk={self.topk}, pool_size={self.pool_size}")
        if "{state}" not in self.template:
            problems.append(f"harr.environment.template={self.template!r} has no {{state}} placeholder")
        check_settings(self, *problems)
