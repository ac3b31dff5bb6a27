"""GRPO over retrieval steps (HARR): the policy is the query encoder, the actions are PL draws.

A trajectory is one run of a frozen generator's multi-hop pipeline on a question; each of its
retrieval steps recorded (state, pool, drawn order, old log-prob) — see
`ragrl.train.retriever_policy.RetrievalStep`. Its reward is the terminal answer F1. As in the
authors' RetrieverGRPOTrainer (github.com/zyc140345/HARR, trl_hacked/trainer/grpo_trainer.py):

- advantage A = (r - mean_group) / (std_group + 1e-4) (Bessel std over the G trajectories of a
  question), the same A for every retrieval step of the trajectory;
- per step, the PPO-clip surrogate on the ratio of the step's joint PL log-prob (all k drawn
  documents together), clip epsilon 0.2, no KL term (beta 0);
- aggregation "grpo": the mean over a trajectory's steps, then the mean over trajectories.

This module reuses the RL core's pure functions (group advantages, broadcast, clipped loss); a
"token" of the core is a retrieval step here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from ragrl.errors import InputError
from ragrl.train.advantages import group_advantages, token_advantages
from ragrl.train.losses import LossAgg, policy_loss
from ragrl.train.retriever_policy import RetrievalStep, recompute_log_probs

# HARR's epsilon in the advantage denominator (their `std + 1e-4`), not the core's 1e-6 default.
HARR_ADV_EPS = 1e-4


@dataclass
class Trajectory:
    """One rollout of the pipeline on a question: its retrieval steps and its terminal reward."""

    question_id: str
    group: int
    reward: float
    steps: list[RetrievalStep] = field(default_factory=list)
    answer: str = ""


# --- the training filter ---------------------------------------------------------------------------


def keep_question(f1s: Sequence[float]) -> bool:
    """HARR's filter: keep a question only if the F1 of its stochastic rollouts varies.

    A question every rollout answers equally well (or equally badly) gives every trajectory the
    same reward, hence zero advantage: it costs a rollout group and teaches nothing. The authors
    test np.std(f1s) > 0, which is max > min.
    """
    if len(f1s) < 2:
        raise InputError(f"the filter needs at least 2 rollouts per question, got {len(f1s)}")
    return max(f1s) > min(f1s)


def filter_questions(f1_by_question: Mapping[str, Sequence[float]], group_size: int) -> list[str]:
    """The ids of the questions to train on, in the given order; each must have `group_size` F1s."""
    short = {q: len(v) for q, v in f1_by_question.items() if len(v) != group_size}
    if short:
        first = sorted(short)[:5]
        raise ValueError(f"{len(short)} question(s) have a number of rollouts other than {group_size}: "
                         + ", ".join(f"{q} ({short[q]})" for q in first))
    return [q for q, f1s in f1_by_question.items() if keep_question(f1s)]


# --- advantages and loss ---------------------------------------------------------------------------


def step_mask(trajectories: Sequence[Trajectory]) -> torch.Tensor:
    """[B, S] 1 for each recorded retrieval step, 0 for padding (S = the most steps of any trajectory)."""
    width = max([len(t.steps) for t in trajectories] + [1])
    mask = torch.zeros(len(trajectories), width)
    for i, t in enumerate(trajectories):
        mask[i, : len(t.steps)] = 1.0
    return mask


def step_advantages(trajectories: Sequence[Trajectory], eps: float = HARR_ADV_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Group advantages broadcast to every retrieval step: ([B, S] advantages, [B, S] mask)."""
    rewards = [t.reward for t in trajectories]
    groups = [t.group for t in trajectories]
    mask = step_mask(trajectories)
    return token_advantages(group_advantages(rewards, groups, scale_by_std=True, eps=eps), mask), mask


def steps_tensor(trajectories: Sequence[Trajectory], values: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Lay per-step values (flattened in trajectory, then step order) out as [B, S], zero-padded."""
    mask = step_mask(trajectories)
    flat = torch.as_tensor(values, dtype=torch.float32) if not isinstance(values, torch.Tensor) else values
    if flat.numel() != int(mask.sum()):
        raise ValueError(f"{flat.numel()} step values for {int(mask.sum())} retrieval steps")
    out = torch.zeros(mask.shape, dtype=flat.dtype, device=flat.device)
    return out.masked_scatter(mask.to(flat.device).bool(), flat)


def retrieval_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                   clip_eps: float = 0.2, loss_agg: str = "grpo") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """HARR's loss on [B, S] step log-probs: PPO-clip per step, then a mean over steps and over
    trajectories ("grpo") or over all the batch's steps ("token-mean", TRL's bnpo)."""
    return policy_loss(new_logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps,
                       loss_agg=cast(LossAgg, loss_agg))


# --- one update --------------------------------------------------------------------------------------


def update(policy: Any, index: Any, optimizer: torch.optim.Optimizer, trajectories: Sequence[Trajectory], *,
           alpha: float, clip_eps: float = 0.2, max_grad_norm: float | None = 1.0,
           loss_agg: str = "grpo") -> dict[str, float]:
    """One optimizer step on a batch of trajectories (HARR: 16 questions x G 8, one update per batch).

    The old log-probs are the rollout's; `logprob_mismatch` reports how far the recomputation
    before the update strays from them (0 up to float noise: nothing is quantised).
    """
    steps = [s for t in trajectories for s in t.steps]
    adv, mask = step_advantages(trajectories)
    stats: dict[str, float] = {
        "reward_mean": float(torch.tensor([t.reward for t in trajectories]).mean()) if trajectories else 0.0,
        "steps": float(len(steps)),
        "zero_adv_share": float((adv.abs().sum(-1) == 0).float().mean()) if trajectories else 0.0,
    }
    if not steps:
        return {**stats, "loss": 0.0, "updated": 0.0}
    old_flat = torch.tensor([s.old_log_prob for s in steps], dtype=torch.float32)
    new_flat = recompute_log_probs(policy, index, steps, alpha)
    stats["logprob_mismatch"] = float((new_flat.detach().cpu() - old_flat).abs().max())
    device = new_flat.device
    loss, parts = retrieval_loss(steps_tensor(trajectories, new_flat), steps_tensor(trajectories, old_flat).to(device),
                                 adv.to(device), mask.to(device), clip_eps, loss_agg)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if max_grad_norm is not None:
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    optimizer.step()
    return {**stats, "loss": float(loss.detach()), "updated": 1.0, **{k: float(v) for k, v in parts.items()}}
