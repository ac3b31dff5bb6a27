"""Advantages without a critic: group-relative (GRPO) and turn-level (KG-R1), as pure functions.

Every function takes plain tensors/lists and returns new tensors. Token-level results are [B, T]
over right-padded response positions and are exactly zero wherever loss_mask is 0, so an
observation token (retrieved text) or padding can never carry a learning signal even if a loss
forgot the mask.
"""

from __future__ import annotations

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
