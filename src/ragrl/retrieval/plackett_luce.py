"""Stochastic retrieval as a Plackett–Luce draw: k documents without replacement from a pool of K.

HARR (arXiv 2602.03645) turns a dense retriever into a policy: the pool is the top-K of the index
for the current query, and the action is an ordered k-subset drawn from softmax(score / alpha)
without replacement. Its probability is the Plackett–Luce product

    P(d_1, ..., d_k) = prod_j  exp(s_{d_j} / alpha) / sum_{d not in {d_1..d_{j-1}}} exp(s_d / alpha)

so the log-probability is the sum over positions of a log-softmax over the not-yet-chosen pool.

Pure tensor functions, batched over any leading dimensions ([..., K] scores, [..., k] orders).
The log-probability is differentiable with respect to the scores, which is how the query encoder
receives its gradient. The sampler uses the Gumbel-top-k trick (Yellott 1977; Kool et al. 2019):
the k largest of score / alpha + Gumbel noise form an exact Plackett–Luce sample, in one sort and
reproducible from a torch.Generator.
"""

from __future__ import annotations

import torch

from ragrl.errors import InputError


def _check(scores: torch.Tensor, k: int, alpha: float) -> None:
    if scores.dim() < 1:
        raise ValueError("Plackett-Luce scores must have at least one dimension (the pool)")
    pool = scores.shape[-1]
    if k < 1:
        raise InputError(f"Plackett-Luce draw of k={k} documents: k must be >= 1")
    if k > pool:
        raise InputError(f"Plackett-Luce draw of k={k} documents from a pool of only {pool}: "
                         "the index returned fewer candidates than the draw needs (raise the pool size K "
                         "or lower k)")
    if not alpha > 0:
        raise InputError(f"Plackett-Luce temperature alpha={alpha} must be > 0")
    if not bool(torch.isfinite(scores).all()):
        bad = int((~torch.isfinite(scores)).sum())
        raise ValueError(f"Plackett-Luce pool has {bad} non-finite score(s); drop missing candidates "
                         "(FAISS id -1) from the pool instead of padding them")


def _logits(scores: torch.Tensor, alpha: float) -> torch.Tensor:
    # At least float32: at alpha = 0.05 a half-precision score difference of 1e-3 is already 2%
    # of a logit, and the ratio of two such log-probs would be noise.
    if scores.dtype not in (torch.float32, torch.float64):
        scores = scores.float()
    return scores / alpha


def step_log_probs(scores: torch.Tensor, order: torch.Tensor, alpha: float) -> torch.Tensor:
    """log P(order[..., j] | order[..., :j]) for each position j: [..., k].

    `order` holds pool positions (0..K-1), distinct within each row, in the order they were drawn.
    """
    order = order.long()
    k = order.shape[-1]
    _check(scores, k, alpha)
    if order.shape[:-1] != scores.shape[:-1]:
        raise ValueError(f"Plackett-Luce order of shape {tuple(order.shape)} does not match scores of shape "
                         f"{tuple(scores.shape)} (leading dimensions differ)")
    pool = scores.shape[-1]
    if bool(((order < 0) | (order >= pool)).any()):
        raise ValueError(f"Plackett-Luce order has a position outside the pool 0..{pool - 1}")
    ordered = order.sort(dim=-1).values
    if bool((ordered[..., 1:] == ordered[..., :-1]).any()):
        raise ValueError("Plackett-Luce order repeats a document: a draw is without replacement")
    logits = _logits(scores, alpha)
    chosen = torch.nn.functional.one_hot(order, num_classes=pool).to(torch.bool)  # [..., k, K]
    # Position j may not pick what positions 0..j-1 picked: an exclusive cumulative sum.
    taken_before = (chosen.cumsum(dim=-2) - chosen.long()).to(torch.bool)
    masked = logits.unsqueeze(-2).expand(*chosen.shape).masked_fill(taken_before, float("-inf"))
    log_softmax = torch.log_softmax(masked, dim=-1)
    return torch.gather(log_softmax, -1, order.unsqueeze(-1)).squeeze(-1)


def log_prob(scores: torch.Tensor, order: torch.Tensor, alpha: float) -> torch.Tensor:
    """Joint log-probability of the ordered k-subset `order` under PL(softmax(scores / alpha)): [...]."""
    return step_log_probs(scores, order, alpha).sum(dim=-1)


def sample(scores: torch.Tensor, k: int, alpha: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw an ordered k-subset of pool positions without replacement: [..., k] (int64).

    Scores are detached: sampling is the rollout's side and carries no gradient.
    """
    _check(scores, k, alpha)
    logits = _logits(scores.detach(), alpha)
    uniform = torch.rand(logits.shape, generator=generator, dtype=logits.dtype, device=logits.device)
    # Clamp away from 0 so that -log(-log(u)) stays finite in every dtype.
    tiny = torch.finfo(logits.dtype).tiny
    gumbel = -torch.log(-torch.log(uniform.clamp(min=tiny, max=1.0 - torch.finfo(logits.dtype).eps)))
    return torch.topk(logits + gumbel, k, dim=-1, sorted=True).indices


def greedy(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Deterministic top-k pool positions (evaluation), in descending score order: [..., k]."""
    _check(scores, k, 1.0)
    return torch.topk(scores.detach(), k, dim=-1, sorted=True).indices
