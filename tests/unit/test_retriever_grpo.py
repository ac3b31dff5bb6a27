"""GRPO over retrieval steps: the filter, advantages broadcast to steps, the clipped loss, learning."""

from __future__ import annotations

import itertools
import math

import faiss
import numpy as np
import pytest
import torch

from ragrl.retrieval import plackett_luce as pl
from ragrl.train.retriever_grpo import (
    Trajectory,
    filter_questions,
    keep_question,
    retrieval_loss,
    step_advantages,
    steps_tensor,
    update,
)
from ragrl.train.retriever_policy import RetrievalStep, retrieve

from harr_helpers import ToyPolicy, one_thread  # noqa: F401  (one_thread: autouse)


def _step(logp: float = -1.0) -> RetrievalStep:
    return RetrievalStep("s", [0, 1, 2], [0, 1], logp)


def test_filter_keeps_questions_whose_f1_varies():
    assert keep_question([0.0, 0.0, 0.4, 0.0]) is True
    assert keep_question([1.0] * 8) is False
    assert keep_question([0.0] * 8) is False
    with pytest.raises(ValueError, match="at least 2"):
        keep_question([0.3])
    assert filter_questions({"q1": [0, 1], "q2": [0.5, 0.5], "q0": [1, 0.2]}, 2) == ["q1", "q0"]
    with pytest.raises(ValueError, match=r"q2 \(3\)"):
        filter_questions({"q1": [0, 1], "q2": [0, 1, 1]}, 2)


def test_advantages_are_broadcast_to_every_retrieval_step():
    trajs = [Trajectory("a", 0, 1.0, [_step(), _step()]), Trajectory("a", 0, 0.0, [_step()]),
             Trajectory("b", 1, 0.5, [_step(), _step(), _step()]), Trajectory("b", 1, 0.5, [_step()])]
    adv, mask = step_advantages(trajs)
    # group a: mean 0.5, Bessel std sqrt(0.5); HARR's eps 1e-4. Group b ties: advantage 0.
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    want = torch.tensor([[a, a, 0.0], [-a, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(mask, torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]]))
    laid = steps_tensor(trajs, [1, 2, 3, 4, 5, 6, 7])
    torch.testing.assert_close(laid, torch.tensor([[1.0, 2, 0], [3, 0, 0], [4, 5, 6], [7, 0, 0]]))
    with pytest.raises(ValueError, match="6 step values for 7"):
        steps_tensor(trajs, [1, 2, 3, 4, 5, 6])


def test_clipped_loss_by_hand():
    # Trajectory 0: two steps, A = +0.7; ratios e^0.5 (clipped to 1.2) and e^-0.1 (not clipped).
    # Trajectory 1: one step, A = -0.7, ratio e^0.5 (not clipped on the negative side: min picks r*A).
    new = torch.tensor([[-0.5, -1.1], [-0.5, 0.0]])
    old = torch.tensor([[-1.0, -1.0], [-1.0, 0.0]])
    adv = torch.tensor([[0.7, 0.7], [-0.7, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = retrieval_loss(new, old, adv, mask, clip_eps=0.2)
    t0 = (-(1.2 * 0.7) + -(math.exp(-0.1) * 0.7)) / 2
    t1 = math.exp(0.5) * 0.7
    assert float(loss) == pytest.approx((t0 + t1) / 2, rel=1e-6)
    assert float(stats["clip_frac"]) == pytest.approx(1 / 3)
    # TRL's bnpo (harr.train.loss_agg token-mean): one mean over the batch's three steps.
    bnpo, _ = retrieval_loss(new, old, adv, mask, clip_eps=0.2, loss_agg="token-mean")
    assert float(bnpo) == pytest.approx((2 * t0 + t1) / 3, rel=1e-6)


def test_grpo_over_retrieval_steps_learns_to_retrieve_the_rewarded_document():
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(20, 8)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(8)
    index.add(docs)
    state = "Query: q"
    policy = ToyPolicy([state], 8, seed=1)
    pool_size, k, alpha, group = 20, 3, 0.3, 8
    opt = torch.optim.Adam(policy.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    target = int(np.argsort(docs @ policy.encode([state])[0].numpy())[len(docs) // 2])  # a middling document

    orders = torch.tensor([o for o in itertools.permutations(range(len(docs)), k) if target in o])

    def p_target() -> float:
        """P(target among the k drawn): the PL probabilities of every ordered draw containing it."""
        scores = (torch.from_numpy(docs) @ policy.encode([state])[0]).expand(len(orders), -1)
        return float(pl.log_prob(scores, orders, alpha).exp().sum())

    first = None
    before = p_target()
    for _ in range(30):
        steps = retrieve(policy, index, [state] * group, pool_size=pool_size, k=k, alpha=alpha, generator=gen)
        trajs = [Trajectory("q", 0, float(target in s.doc_ids), [s]) for s in steps]
        stats = update(policy, index, opt, trajs, alpha=alpha)
        first = stats if first is None else first
    assert first["logprob_mismatch"] < 1e-6  # old == recomputed before the first update
    after = p_target()
    assert after > before + 0.3, (before, after)
