"""Advantages as pure functions: without a critic, group-relative (GRPO) and turn-level (KG-R1);
with one, GAE over the policy's tokens (algorithm ppo).

Every function takes plain tensors/lists and returns new tensors. Token-level results are [B, T]
over right-padded response positions and are exactly zero wherever loss_mask is 0, so an
observation token (retrieved text) or padding can never carry a learning signal even if a loss
forgot the mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

EPS = 1e-6


def _normalise(values: torch.Tensor, scale_by_std: bool, eps: float) -> torch.Tensor:
    # Bessel-corrected std, as TRL's and verl's GRPO use; a lone value has no spread, so its
    # advantage is 0 (r - mean) instead of nan.
    centred = values - values.mean()
    if not scale_by_std:
        return centred
    std = values.std() if values.numel() > 1 else values.new_zeros(())
    return centred / (std + eps)


def group_advantages(
    rewards: Sequence[float] | torch.Tensor,
    groups: Sequence[int] | torch.Tensor,
    scale_by_std: bool = True,
    eps: float = EPS,
) -> torch.Tensor:
    """Per-sample (r - mean_group) / (std_group + eps); without the std division when scale_by_std
    is False (Dr. GRPO: dividing by std over-weights groups that are almost all right or wrong)."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    groups = torch.as_tensor(groups)
    out = torch.zeros_like(rewards)
    for g in torch.unique(groups):
        members = groups == g
        out[members] = _normalise(rewards[members], scale_by_std, eps)
    return out.float()


def baseline_advantages(rewards: Sequence[float] | torch.Tensor,
                        baselines: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Per-sample r - b, b the reward the policy's greedy rollout of the same prompt earned (ReMax,
    Li et al., arXiv:2310.10505; verl's adv_estimator=remax). Not divided by a std: a sample that does what
    greedy decoding does gets 0, one that beats it gets the whole margin."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    baselines = torch.as_tensor(baselines, dtype=torch.float64)
    if rewards.shape != baselines.shape:
        raise ValueError(f"{rewards.numel()} rewards but {baselines.numel()} baselines")
    return (rewards - baselines).float()


def batch_advantages(
    rewards: Sequence[float] | torch.Tensor, mean: float, std: float, scale_by_std: bool = True, eps: float = EPS
) -> torch.Tensor:
    """(r - mean) / (std + eps) with batch statistics supplied by the caller (who may have pooled
    them over processes): the critic-free baseline of the ppo_clip algorithm (REINFORCE++-style)."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    centred = rewards - mean
    return (centred / (std + eps) if scale_by_std else centred).float()


def turn_advantages(
    turn_rewards: Sequence[Sequence[float] | None],
    groups: Sequence[int],
    scale_by_std: bool = True,
    eps: float = EPS,
) -> list[list[float]]:
    """Per-turn advantages: within a group, pool the turn rewards of all its samples and normalise
    each by the pool's mean and std. A sample without turn rewards gets an empty list (no turn signal).
    """
    out: list[list[float]] = [[] for _ in turn_rewards]
    for g in sorted(set(groups)):
        members = [i for i, gi in enumerate(groups) if gi == g and turn_rewards[i]]
        if not members:
            continue
        pooled = torch.tensor([r for i in members for r in turn_rewards[i]], dtype=torch.float64)
        normalised = _normalise(pooled, scale_by_std, eps).tolist()
        offset = 0
        for i in members:
            n = len(turn_rewards[i])
            out[i] = normalised[offset : offset + n]
            offset += n
    return out


def token_advantages(
    sequence_adv: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_index: torch.Tensor | None = None,
    turn_adv: Sequence[Sequence[float]] | None = None,
    turn_weight: float = 0.0,
) -> torch.Tensor:
    """Broadcast to tokens: A[i, t] = turn_weight * A_turn[i, turn_index[i, t]] + A_global[i], zero where mask is 0.

    A token whose turn has no turn advantage (sample without turn rewards, or a turn index past the
    end of its list) gets only the global part.
    """
    mask = loss_mask.float()
    adv = sequence_adv.float().unsqueeze(-1).expand_as(mask).clone()
    if turn_weight != 0.0 and turn_adv is not None and turn_index is not None:
        per_turn = torch.zeros(mask.shape, dtype=torch.float32)
        for i, values in enumerate(turn_adv):
            if not values:
                continue
            table = torch.tensor(list(values), dtype=torch.float32)
            idx = turn_index[i].long()
            known = (idx >= 0) & (idx < len(table))
            per_turn[i, known] = table[idx[known]]
        adv = adv + turn_weight * per_turn
    return adv * mask


# --- PPO with a critic (algorithm ppo) ---------------------------------------------------------

WHITEN_EPS = 1e-8  # verl's masked_whiten: (x - mean) * rsqrt(var + 1e-8)


def token_level_rewards(
    scores: Sequence[float] | torch.Tensor,
    loss_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """[B, T] rewards: each sample's scalar score on its *last policy token*, minus kl_coef * kl on
    every policy token (verl's token_level_scores - beta * kld, with use_kl_in_reward).

    The last policy token, not the last response token: GAE below steps over observation tokens,
    so a score left on a trailing observation (a rollout cut off after a search) would be lost.
    A sample without any policy token gets no reward (it has no action to credit).
    """
    mask = loss_mask.float()
    rewards = torch.zeros(mask.shape, dtype=torch.float32)
    scores = torch.as_tensor(scores, dtype=torch.float32)
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] = scores[rows]
    if kl is not None and kl_coef != 0.0:
        rewards = rewards - kl_coef * kl.float() * mask
    return rewards


def gae_advantages_returns(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lam) advantages and returns [B, T] over the policy tokens only (not whitened).

    Observation tokens (loss_mask 0: retrieved text the environment inserted) and padding are
    *skipped*, as verl's compute_gae_advantage_return does since its multi-turn agent loop: the
    recursion runs over the policy tokens as if the observations were not there, so for policy
    tokens t < t' adjacent in that subsequence

        delta_t = r_t + gamma * V(t') - V(t),     A_t = delta_t + gamma * lam * A_t',

    with V(t') = 0 and A_t' = 0 after the last policy token. An observation is part of the state
    the next policy token's value sees, not a step of its own: it earns no reward, needs no value
    target, and is neither discounted nor lambda-decayed over. Returns are A + V (the critic's
    target). Both are zero wherever loss_mask is 0 (verl leaves carried-over numbers there that
    every loss then masks; zeros make a forgotten mask harmless).
    """
    mask = loss_mask.float()
    rewards = token_rewards.float()
    values = values.float()
    batch, length = mask.shape
    next_value = torch.zeros(batch)
    next_adv = torch.zeros(batch)
    advantages = torch.zeros(batch, length)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        on = mask[:, t] > 0
        # On a masked token the carried value and advantage pass through unchanged.
        next_value = torch.where(on, values[:, t], next_value)
        next_adv = torch.where(on, adv_t, next_adv)
        advantages[:, t] = torch.where(on, adv_t, torch.zeros_like(adv_t))
    returns = (advantages + values) * mask
    return advantages, returns


def masked_moments(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(count, sum, sum of squares) of the mask-1 entries, in float64: what processes pool before whitening."""
    mask = mask.double()
    v = values.double() * mask
    return float(mask.sum()), float(v.sum()), float((v * v).sum())


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    moments: tuple[float, float, float] | None = None,
    eps: float = WHITEN_EPS,
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the mask-1 entries, zero elsewhere (verl's masked_whiten:
    Bessel-corrected variance, eps inside the root).

    `moments` (count, sum, sum of squares, see masked_moments) lets the caller whiten with the
    statistics of the whole batch pooled over processes, as verl whitens the whole batch at once.
    A lone entry (count 1) has no spread: it is only centred, to 0, instead of verl's error.
    """
    count, total, total_sq = moments if moments is not None else masked_moments(values, mask)
    if count < 1:
        return torch.zeros_like(values, dtype=torch.float32)
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0) * count / (count - 1) if count > 1 else 0.0
    centred = values.double() - mean
    scaled = centred / math.sqrt(var + eps) if count > 1 else centred
    return (scaled * mask.double()).float()
