"""Plackett–Luce draws: log-probabilities against brute-force enumeration, the sampler against them."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy.stats import chisquare

from ragrl.retrieval import plackett_luce as pl


def product_formula(scores: list[float], order: tuple[int, ...], alpha: float) -> float:
    """P(order) written out as the PL product, in plain Python floats (independent of the module)."""
    left = list(range(len(scores)))
    p = 1.0
    for d in order:
        p *= math.exp(scores[d] / alpha) / sum(math.exp(scores[j] / alpha) for j in left)
        left.remove(d)
    return p


@pytest.mark.parametrize(("scores", "k", "alpha"), [
    ([0.31, 0.27, 0.22, 0.05, -0.1], 3, 0.05),
    ([0.9, 0.1, 0.5, 0.5], 2, 0.3),
    ([1.0, 2.0, 3.0], 3, 1.0),  # k = K
])
def test_log_prob_matches_enumeration_and_sums_to_one(scores, k, alpha):
    orders = list(itertools.permutations(range(len(scores)), k))
    s = torch.tensor([scores] * len(orders), dtype=torch.float64)
    got = pl.log_prob(s, torch.tensor(orders), alpha).exp()
    want = torch.tensor([product_formula(scores, o, alpha) for o in orders], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert float(got.sum()) == pytest.approx(1.0, abs=1e-10)


def test_step_log_probs_last_step_of_a_full_draw_is_certain():
    steps = pl.step_log_probs(torch.tensor([0.2, 0.7, 0.1]), torch.tensor([1, 2, 0]), 0.5)
    assert float(steps[-1]) == 0.0  # one document left: it is drawn with probability 1
    first = math.log(math.exp(1.4) / (math.exp(0.4) + math.exp(1.4) + math.exp(0.2)))
    assert float(steps[0]) == pytest.approx(first, rel=1e-6)


def test_ties_give_the_uniform_distribution():
    # 5 tied documents, 3 drawn: every one of the 5*4*3 = 60 ordered subsets has probability 1/60.
    logp = pl.log_prob(torch.full((5,), 0.4), torch.tensor([4, 0, 2]), 0.05)
    assert float(logp) == pytest.approx(-math.log(60), rel=1e-6)


def test_tiny_and_large_temperatures():
    scores = torch.tensor([0.5, 0.4, 0.3, 0.2])
    # alpha -> 0: the greedy order is certain and any other order is (numerically) impossible.
    assert float(pl.log_prob(scores, torch.tensor([0, 1]), 1e-6)) == pytest.approx(0.0, abs=1e-6)
    assert float(pl.log_prob(scores, torch.tensor([1, 0]), 1e-6)) < -1e4
    assert pl.sample(scores, 2, 1e-6, torch.Generator().manual_seed(0)).tolist() == [0, 1]
    # alpha -> inf: uniform over the 4*3 ordered pairs.
    assert float(pl.log_prob(scores, torch.tensor([3, 2]), 1e6)) == pytest.approx(-math.log(12), abs=1e-5)


def test_gradient_is_the_analytic_one():
    # k = 1: d log softmax(s/a)_i / ds = (onehot_i - softmax(s/a)) / a.
    s = torch.tensor([0.3, -0.2, 0.8], dtype=torch.float64, requires_grad=True)
    pl.log_prob(s, torch.tensor([1]), 0.5).backward()
    want = (torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64) - torch.softmax(s.detach() / 0.5, 0)) / 0.5
    torch.testing.assert_close(s.grad, want)
    # k = 3 of 4, against finite differences.
    x = torch.tensor([0.3, -0.2, 0.8, 0.1], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: pl.log_prob(t, torch.tensor([2, 0, 3]), 0.2), (x,))


def _empirical(scores: list[float], k: int, alpha: float, n: int, seed: int) -> tuple[list, list[int]]:
    draws = pl.sample(torch.tensor([scores] * n), k, alpha, torch.Generator().manual_seed(seed))
    orders = list(itertools.permutations(range(len(scores)), k))
    index = {o: i for i, o in enumerate(orders)}
    counts = [0] * len(orders)
    for row in draws.tolist():
        counts[index[tuple(row)]] += 1
    return orders, counts


def test_sampler_matches_the_pl_probabilities_chi_square():
    scores, k, alpha, n = [0.30, 0.25, 0.21, 0.12], 2, 0.05, 20000
    orders, counts = _empirical(scores, k, alpha, n, seed=1234)
    probs = [product_formula(scores, o, alpha) for o in orders]
    assert chisquare(counts, [p * n for p in probs]).pvalue > 1e-3
    # The same test rejects the wrong temperature: it can fail.
    wrong = [product_formula(scores, o, 2 * alpha) for o in orders]
    assert chisquare(counts, [p * n for p in wrong]).pvalue < 1e-6


def test_sampler_draws_without_replacement_and_is_reproducible():
    scores = torch.randn(64, 30, generator=torch.Generator().manual_seed(0))
    a = pl.sample(scores, 3, 0.05, torch.Generator().manual_seed(7))
    b = pl.sample(scores, 3, 0.05, torch.Generator().manual_seed(7))
    assert a.shape == (64, 3) and torch.equal(a, b)
    assert all(len(set(row)) == 3 for row in a.tolist())
    assert pl.greedy(torch.tensor([0.1, 0.9, 0.5]), 2).tolist() == [1, 2]


@pytest.mark.parametrize(("scores", "order", "k", "alpha", "message"), [
    ([0.1, 0.2], None, 3, 0.05, "pool of only 2"),
    ([0.1, 0.2], None, 0, 0.05, "k must be >= 1"),
    ([0.1, 0.2], None, 1, 0.0, "alpha=0.0 must be > 0"),
    ([0.1, float("nan")], None, 1, 0.05, "non-finite"),
    ([0.1, 0.2, 0.3], [0, 0], None, 0.05, "repeats a document"),
    ([0.1, 0.2, 0.3], [0, 3], None, 0.05, "outside the pool"),
])
def test_bad_input_gives_a_clear_error(scores, order, k, alpha, message):
    with pytest.raises(ValueError, match=message):
        if order is None:
            pl.sample(torch.tensor(scores), k, alpha)
        else:
            pl.log_prob(torch.tensor(scores), torch.tensor(order), alpha)
