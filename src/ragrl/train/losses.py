"""Policy-gradient loss terms as pure tensor functions.

Shapes: logits [B, T, V]; everything per token is [B, T] over the *response* positions only, with
`mask` 1 where the policy generated the token and 0 for observations (retrieved passages, tool
output) and padding. Nothing here reads a global or touches a model, so each term can be checked
against a hand computation.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.utils.checkpoint

from ragrl.errors import InputError

LossAgg = Literal["token-mean", "grpo", "dr_grpo"]
from ragrl.settings import LOSS_AGG_MODES

# exp() of a log-ratio beyond this overflows float32 (e^88); a ratio of e^20 is already absurd and
# would be clipped anyway, so clamping changes no sane update while keeping inf/nan out of gradients.
MAX_LOG_RATIO = 20.0
# verl's low_var_kl / k3 clamps each token's k3 to 10: beyond it (the policy ~14x less likely than
# the reference on a token) the term carries no gradient, instead of one that grows as exp(d) and
# outweighs the policy gradient (at kl_coef 0.01 it does from d = 5).
MAX_K3 = 10.0


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(labels) under softmax(logits / temperature), computed in float32.

    gather-minus-logsumexp instead of log_softmax: it never materialises a second [B, T, V] tensor,
    which is the largest tensor in RL training for a real vocabulary.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, -1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def chunked_token_logprobs(
    hidden: torch.Tensor,
    head,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs(head(hidden), labels, temperature)` (and `entropy_from_logits`) without the
    [B, T, V] logits: the head runs on `chunk_tokens` of the B x T positions at a time.

    hidden [B, T, H] are the states the LM head reads; head maps [N, H] to logits [N, V]; labels
    [B, T]. chunk_tokens <= 0 is one chunk. Positions are chunked over rows and columns together,
    so a chunk's size, and the memory of its logits, does not depend on how the micro-batch is
    shaped. With gradients on, each chunk runs under non-reentrant activation checkpointing: its
    logits are dropped after the forward and recomputed in the backward, so only one chunk's
    logits live at a time in either pass (the cost: the head's matmul once more per backward).
    Entropy is a logged statistic: with gradients on, each chunk's head runs once more for it,
    without gradients and outside the checkpoint (so the backward does not recompute it); with
    `entropy_grad` (an entropy bonus in the loss) it comes out of the checkpointed chunk instead,
    with its gradient.
    """
    rows, width = labels.shape
    flat_hidden = hidden.reshape(rows * width, hidden.shape[-1])
    flat_labels = labels.reshape(rows * width)
    total = flat_labels.shape[0]
    step = chunk_tokens if chunk_tokens > 0 else max(total, 1)

    def chunk_logp(h: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
        return token_logprobs(head(h), lab, temperature)

    def chunk_both(h: torch.Tensor, lab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = head(h)
        return token_logprobs(logits, lab, temperature), entropy_from_logits(logits, temperature)

    logps, ents = [], []
    for start in range(0, total, step):
        h, lab = flat_hidden[start : start + step], flat_labels[start : start + step]
        if torch.is_grad_enabled() and with_entropy and entropy_grad:
            logp_c, ent_c = torch.utils.checkpoint.checkpoint(chunk_both, h, lab, use_reentrant=False,
                                                              preserve_rng_state=False)
            logps.append(logp_c)
            ents.append(ent_c)
        elif torch.is_grad_enabled():
            # preserve_rng_state off: an LM head draws no random numbers, and saving the CUDA RNG
            # state costs a device sync per chunk.
            logps.append(torch.utils.checkpoint.checkpoint(chunk_logp, h, lab, use_reentrant=False,
                                                           preserve_rng_state=False))
            if with_entropy:
                with torch.no_grad():
                    ents.append(entropy_from_logits(head(h.detach()), temperature))
        else:
            logits = head(h)
            logps.append(token_logprobs(logits, lab, temperature))
            if with_entropy:
                ents.append(entropy_from_logits(logits, temperature))
            del logits
    if not logps:  # no positions at all (B or T is 0: a packed micro-batch of empty responses)
        # Still in the graph (through `hidden`), so a loss made of it backpropagates zeros.
        empty = hidden.new_zeros((rows, width), dtype=torch.float32) + hidden.sum().float() * 0
        return empty, (empty.detach().clone() if with_entropy else None)
    logp = torch.cat(logps).reshape(rows, width)
    return logp, (torch.cat(ents).reshape(rows, width) if with_entropy else None)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-position entropy of softmax(logits / temperature), [B, T]."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || ref) per token: exp(d) - d - 1 with d = ref - logp.

    Unbiased for samples from the policy and never negative, unlike the plain log-ratio (k1).
    Clamped to MAX_K3 per token, as verl's.
    """
    d = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return (torch.exp(d) - d - 1.0).clamp(max=MAX_K3)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The plain log-ratio logp - ref_logp per token (verl's kl_penalty "kl"): unbiased for
    samples from the policy but negative on some tokens; what PPO-RLHF puts into the reward."""
    return logp - ref_logp


def kl_per_token(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    if estimator == "k3":
        return kl_k3(logp, ref_logp)
    if estimator == "k1":
        return kl_k1(logp, ref_logp)
    raise InputError(f"unknown KL estimator {estimator!r}")


def ppo_clip_per_token(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss -min(r A, clip(r, 1-lo, 1+hi) A) and a 0/1 "was clipped" map.

    Separate low/high epsilons allow DAPO's clip-higher; equal values give the PPO paper's objective.
    `clip_ratio_c` is dual-clip PPO (Ye et al. 2019, verl's clip_ratio_c): where A < 0 the loss is
    capped at -A * c, so a token whose ratio has grown far past 1 + eps under a negative advantage
    (the plain clip does not bound that side) cannot dominate the update. Its tokens count as clipped.
    """
    ratio = torch.exp((logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = clipped < unclipped
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        capped = (advantages < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        was_clipped = was_clipped | capped
    return loss, was_clipped.float()


def default_denominator(mask: torch.Tensor, mode: LossAgg, max_response_len: int | None = None) -> float:
    """What `aggregate` divides by when no denominator is given (for one batch on one process).

    The trainer sums this over micro-batches and processes to make the loss of a split batch
    equal to the loss of the whole batch.
    """
    mask = mask.float()
    if mode == "token-mean":
        return float(mask.sum())
    if mode == "grpo":
        return float((mask.sum(-1) > 0).sum())
    if mode == "dr_grpo":
        # Rows without a policy token (a tied group's, filtered out) are not in the batch's count,
        # as token-mean and grpo leave them out: the step's size must not shrink with their share.
        rows = (mask.sum(-1) > 0).sum()
        return float(rows * (max_response_len if max_response_len is not None else mask.shape[-1]))
    raise InputError(f"unknown loss aggregation {mode!r}; expected one of {LOSS_AGG_MODES}")


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAgg,
    max_response_len: int | None = None,
    denominator: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values [B, T] to a scalar over mask-1 tokens.

    token-mean: sum over masked tokens / number of masked tokens (every token weighs the same).
    grpo:       mean over sequences of each sequence's own token mean (every sequence weighs the
                same; sequences with no mask-1 token are left out rather than counted as zero).
    dr_grpo:    sum over masked tokens / (number of sequences x max_response_len): a constant
                normaliser, so long responses are not down-weighted (Dr. GRPO, Liu et al. 2025).
                max_response_len should be the generation limit; it falls back to the padded width.

    `denominator` overrides the default normaliser (see `default_denominator`).
    """
    mask = mask.to(values.dtype)
    # where(), not multiply: a non-finite value at a masked position must not leak nan into the sum.
    masked = torch.where(mask > 0, values, torch.zeros_like(values))
    if mode == "grpo":
        per_seq_count = mask.sum(-1)
        per_seq = masked.sum(-1) / per_seq_count.clamp(min=1.0)
        total = per_seq.sum()
    elif mode in ("token-mean", "dr_grpo"):
        total = masked.sum()
    else:
        raise InputError(f"unknown loss aggregation {mode!r}; expected one of {LOSS_AGG_MODES}")
    if denominator is None:
        denominator = default_denominator(mask, mode, max_response_len)
    return total / max(float(denominator), 1.0)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    loss_agg: LossAgg,
    clip_ratio_c: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
    max_response_len: int | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient loss plus kl_coef * k3 KL to the reference, minus entropy_coeff *
    the per-token entropy (verl's entropy bonus), aggregated by `loss_agg`.

    The KL term sits inside the per-token loss (GRPO-style) rather than in the reward (PPO-RLHF
    style), so it needs no critic and is aggregated exactly like the policy term.
    Returns the scalar loss and detached per-batch statistics (token means over mask-1 tokens).
    """
    pg, was_clipped = ppo_clip_per_token(logp, old_logp, advantages, clip_low, clip_high, clip_ratio_c)
    per_token = pg
    stats: dict[str, torch.Tensor] = {}
    if ref_logp is not None and kl_coef != 0.0:
        kl = kl_k3(logp, ref_logp)
        per_token = per_token + kl_coef * kl
        stats["kl"] = aggregate(kl.detach(), mask, "token-mean")
    if entropy_coeff != 0.0:
        if entropy is None:
            raise ValueError("entropy_coeff needs the per-token entropy (with its gradient)")
        # verl's entropy bonus: pg_loss - entropy_coeff * agg_loss(entropy), the same aggregation.
        per_token = per_token - entropy_coeff * entropy
    loss = aggregate(per_token, mask, loss_agg, max_response_len, denominator)
    stats["pg_loss"] = aggregate(pg.detach(), mask, "token-mean")
    stats["clip_frac"] = aggregate(was_clipped, mask, "token-mean")
    return loss, stats


def value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss, 0.5 * token-mean of max((v - R)^2, (clip(v, V_old +- c) - R)^2)
    over mask-1 tokens (verl's compute_value_loss with token-mean aggregation).

    The clip keeps one update from moving a value further than cliprange_value from the value the
    critic predicted at rollout (the one GAE used); taking the max makes it a pessimistic bound,
    as the policy's clip is. `denominator` overrides the token count, as in `aggregate`.
    Returns the loss and detached statistics: vf_clip_frac, the share of tokens where the
    clipped term was the larger one.
    """
    clipped = old_values + (vpreds - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_sq = (vpreds - returns) ** 2
    clipped_sq = (clipped - returns) ** 2
    per_token = torch.maximum(unclipped_sq, clipped_sq)
    loss = 0.5 * aggregate(per_token, mask, "token-mean", denominator=denominator)
    return loss, {"vf_clip_frac": aggregate((clipped_sq > unclipped_sq).float(), mask, "token-mean")}
