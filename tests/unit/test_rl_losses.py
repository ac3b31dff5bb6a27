"""Loss terms and advantages against independent loop-based computations (pure Python / math)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrl.train import advantages as A
from ragrl.train import losses as L

# --- fixed small inputs ------------------------------------------------------------------------

B, T, V = 3, 4, 5
GEN = torch.Generator().manual_seed(1234)
LOGITS = torch.randn(B, T, V, generator=GEN, dtype=torch.float64) * 2
LABELS = torch.randint(0, V, (B, T), generator=GEN)
# Row 1 has an observation gap; row 2 is entirely masked (e.g. an empty response).
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.float64)
LOGP = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -1.5, -2.5, -0.7], [-1.1, -0.4, -0.9, -2.2]], dtype=torch.float64)
# Old log-probs chosen so the ratios straddle both clip edges: exp(0.5)=1.65, exp(-0.5)=0.61, ~1.
OLD = LOGP - torch.tensor([[0.5, -0.5, 0.05, 0.3], [-0.4, 0.0, 0.6, 0.1], [0.2, -0.2, 0.0, 0.9]], dtype=torch.float64)
ADV = torch.tensor([[1.0, 1.0, -1.0, 2.0], [-1.0, 0.5, 1.0, -2.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
REF = LOGP + torch.tensor([[0.3, -0.2, 0.0, 1.0], [0.1, 0.5, -0.5, -0.3], [0.0, 0.0, 0.2, 0.4]], dtype=torch.float64)


def _rows(x):
    return x.tolist()


def loop_logprob(logits_row, label, temperature=1.0):
    z = [v / temperature for v in logits_row]
    m = max(z)
    return z[label] - (m + math.log(sum(math.exp(v - m) for v in z)))


def loop_entropy(logits_row):
    m = max(logits_row)
    s = sum(math.exp(v - m) for v in logits_row)
    p = [math.exp(v - m) / s for v in logits_row]
    return -sum(pi * math.log(pi) for pi in p)


def loop_pg(logp, old, adv, lo, hi):
    r = math.exp(logp - old)
    return -min(r * adv, min(max(r, 1 - lo), 1 + hi) * adv)


def loop_k3(logp, ref):
    d = ref - logp
    return math.exp(d) - d - 1


def loop_aggregate(values, mask, mode, max_len=None):
    if mode == "token-mean":
        num = sum(v * m for vr, mr in zip(values, mask) for v, m in zip(vr, mr))
        den = sum(m for mr in mask for m in mr)
        return num / max(den, 1)
    if mode == "grpo":
        seq_means = []
        for vr, mr in zip(values, mask):
            n = sum(mr)
            if n:
                seq_means.append(sum(v * m for v, m in zip(vr, mr)) / n)
        return sum(seq_means) / max(len(seq_means), 1)
    if mode == "dr_grpo":
        num = sum(v * m for vr, mr in zip(values, mask) for v, m in zip(vr, mr))
        rows = sum(1 for mr in mask if any(mr))  # a row without a policy token does not count
        return num / max(rows * (max_len if max_len is not None else len(values[0])), 1)
    raise AssertionError(mode)


# --- token log-probs, entropy, KL --------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_loop(temperature):
    got = L.token_logprobs(LOGITS, LABELS, temperature)
    for b in range(B):
        for t in range(T):
            want = loop_logprob(LOGITS[b, t].tolist(), int(LABELS[b, t]), temperature)
            assert got[b, t].item() == pytest.approx(want, abs=1e-6)


def test_token_logprobs_stable_for_huge_logits():
    logits = torch.tensor([[[1000.0, 0.0, -1000.0]]])
    got = L.token_logprobs(logits, torch.tensor([[1]]))
    assert torch.isfinite(got).all()
    assert got.item() == pytest.approx(-1000.0)


def test_entropy_matches_loop():
    got = L.entropy_from_logits(LOGITS)
    for b in range(B):
        for t in range(T):
            assert got[b, t].item() == pytest.approx(loop_entropy(LOGITS[b, t].tolist()), abs=1e-6)


def test_k3_matches_formula_and_is_nonnegative():
    got = L.kl_k3(LOGP, REF)
    for b in range(B):
        for t in range(T):
            assert got[b, t].item() == pytest.approx(loop_k3(LOGP[b, t].item(), REF[b, t].item()), abs=1e-12)
    assert (got >= 0).all()
    assert L.kl_k3(LOGP, LOGP).abs().max().item() == 0.0


# --- PPO clip ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("lo", "hi"), [(0.2, 0.2), (0.2, 0.28)])
def test_ppo_clip_matches_loop(lo, hi):
    got, clipped = L.ppo_clip_per_token(LOGP, OLD, ADV, lo, hi)
    n_clipped = 0
    for b in range(B):
        for t in range(T):
            want = loop_pg(LOGP[b, t].item(), OLD[b, t].item(), ADV[b, t].item(), lo, hi)
            assert got[b, t].item() == pytest.approx(want, abs=1e-12)
            n_clipped += int(clipped[b, t].item())
    # Ratio 1.65 with A>0 and 0.61 with A<0 are clipped; the fixture must exercise both branches.
    assert 0 < n_clipped < B * T


def test_clipped_tokens_get_no_gradient():
    # ratio e^0.5 > 1 + 0.2 with positive advantage: the objective is flat there.
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-0.5, 0.0]])
    loss, _ = L.ppo_clip_per_token(logp, old, torch.tensor([[1.0, 1.0]]), 0.2, 0.2)
    loss.sum().backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-1.0)


def test_dual_clip_caps_negative_advantages_only():
    # Hand-computed, clip 0.2, c 3: ratio e^1.5 = 4.48 with A = -1: PPO's loss is max(4.48, 1.2) = 4.48,
    # dual clip caps it at 3 (and no gradient flows); A = +1 at the same ratio: -min(4.48, 1.2) = -1.2,
    # untouched; ratio e^0.5 = 1.65 with A = -2: 3.30, under the cap 6, untouched.
    logp = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.5, -0.5]])
    adv = torch.tensor([[-1.0, 1.0, -2.0]])
    loss, clipped = L.ppo_clip_per_token(logp, old, adv, 0.2, 0.2, clip_ratio_c=3.0)
    assert loss[0].tolist() == pytest.approx([3.0, -1.2, 2 * math.exp(0.5)])
    assert clipped[0].tolist() == [1.0, 1.0, 0.0]
    loss.sum().backward()
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 2].item() == pytest.approx(2 * math.exp(0.5))
    plain, _ = L.ppo_clip_per_token(logp.detach(), old, adv, 0.2, 0.2)
    assert plain[0, 0].item() == pytest.approx(math.exp(1.5))
    # policy_loss passes it through
    dual, _ = L.policy_loss(logp.detach(), old, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.2,
                            loss_agg="token-mean", clip_ratio_c=3.0)
    assert dual.item() == pytest.approx((3.0 - 1.2 + 2 * math.exp(0.5)) / 3)


def test_entropy_bonus_is_subtracted_and_aggregated_as_the_loss():
    ent = torch.tensor([[2.0, 1.0, 0.5]])
    adv = torch.zeros(1, 3)  # no policy-gradient term: the loss is the bonus alone
    logp = torch.zeros(1, 3)
    loss, _ = L.policy_loss(logp, logp, adv, torch.tensor([[1.0, 1.0, 0.0]]), clip_low=0.2, clip_high=0.2,
                            loss_agg="token-mean", entropy=ent, entropy_coeff=0.1)
    assert loss.item() == pytest.approx(-0.1 * (2.0 + 1.0) / 2)
    # Aggregated as the loss is: per sequence (grpo), by a constant (dr_grpo), by a given denominator.
    ents = torch.tensor([[2.0, 1.0, 0.5], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    zeros = torch.zeros(2, 3)
    for mode, kw, want in (("grpo", {}, ((2.0 + 1.0) / 2 + 4.0) / 2), ("dr_grpo", {"max_response_len": 5}, 7.0 / (2 * 5)),
                           ("token-mean", {"denominator": 7.0}, 7.0 / 7.0)):
        loss, _ = L.policy_loss(zeros, zeros, zeros, mask, clip_low=0.2, clip_high=0.2, loss_agg=mode,
                                entropy=ents, entropy_coeff=0.1, **kw)
        assert loss.item() == pytest.approx(-0.1 * want), mode
    with pytest.raises(ValueError, match="entropy"):
        L.policy_loss(logp, logp, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.2, loss_agg="token-mean",
                      entropy_coeff=0.1)


def test_chunked_entropy_has_the_unchunked_gradient():
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 7, bias=False)
    hidden = torch.randn(2, 5, 4, requires_grad=True)
    labels = torch.randint(0, 7, (2, 5))
    logp, ent = L.chunked_token_logprobs(hidden, head, labels, 0.8, chunk_tokens=3, with_entropy=True,
                                         entropy_grad=True)
    (logp.sum() + 2 * ent.sum()).backward()
    got_h, got_w = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    logits = head(hidden)
    (L.token_logprobs(logits, labels, 0.8).sum() + 2 * L.entropy_from_logits(logits, 0.8).sum()).backward()
    assert torch.allclose(got_h, hidden.grad, atol=1e-6) and torch.allclose(got_w, head.weight.grad, atol=1e-6)
    # without entropy_grad the entropy is a logged statistic: no gradient through it
    _, ent = L.chunked_token_logprobs(hidden, head, labels, 0.8, chunk_tokens=3, with_entropy=True)
    assert not ent.requires_grad


def test_dual_clip_must_exceed_one():
    from ragrl.settings import RLConfig

    with pytest.raises(ValueError, match="clip_ratio_c"):
        RLConfig.from_dict({"clip_ratio_c": 1.0})
    assert RLConfig.from_dict({"clip_ratio_c": 3.0}).clip_ratio_c == 3.0


# --- aggregation -------------------------------------------------------------------------------

# 100 marks values that sit under mask 0 and must not count.
VALUES = torch.tensor(
    [[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 6.0], [100.0, 100.0, 100.0, 100.0]], dtype=torch.float64
)


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("token-mean", (1 + 2 + 3 + 4 + 6) / 5),  # 3.2
        ("grpo", ((1 + 2 + 3) / 3 + (4 + 6) / 2) / 2),  # 3.5: the empty row is left out
        ("dr_grpo", (1 + 2 + 3 + 4 + 6) / (2 * 4)),  # the empty row is left out of the count too
    ],
)
def test_aggregate_hand_values(mode, want):
    assert L.aggregate(VALUES, MASK, mode).item() == pytest.approx(want)
    assert loop_aggregate(_rows(VALUES), _rows(MASK), mode) == pytest.approx(want)


def test_dr_grpo_uses_the_constant_not_the_padded_width():
    assert L.aggregate(VALUES, MASK, "dr_grpo", max_response_len=10).item() == pytest.approx(16 / 20)


@pytest.mark.parametrize("mode", L.LOSS_AGG_MODES)
def test_a_filtered_groups_rows_do_not_change_the_loss(mode):
    # filter_tied_groups zeroes a tied group's loss mask: the loss must be the kept rows' alone,
    # as if the group had never been sampled, in every mode (dr_grpo counted the rows and shrank
    # the step by the kept share).
    kept = L.aggregate(VALUES[:2], MASK[:2], mode, max_response_len=6)
    filtered = torch.cat([VALUES[:2], VALUES[:2] * 7])
    mask = torch.cat([MASK[:2], torch.zeros_like(MASK[:2])])
    assert L.aggregate(filtered, mask, mode, max_response_len=6).item() == pytest.approx(kept.item())


def test_k3_is_clamped_at_10_with_no_gradient_beyond_as_verls():
    # A token the policy made 1,100 times less likely than the reference (d = 7): exp(7) - 8 = 1,089
    # unclamped, with a gradient of -1,096 that would swamp the policy gradient.
    logp = torch.tensor([-8.0, -1.1], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    k3 = L.kl_k3(logp, ref)
    k3.sum().backward()
    assert k3[0].item() == 10.0 and logp.grad[0].item() == 0.0
    d = 0.1  # below the clamp: the formula and its gradient 1 - exp(d)
    assert k3[1].item() == pytest.approx(math.exp(d) - d - 1) and logp.grad[1].item() == pytest.approx(1 - math.exp(d))


def test_aggregate_ignores_nonfinite_values_under_the_mask():
    values = VALUES.clone()
    values[2, 0] = float("inf")
    values[1, 1] = float("nan")
    for mode in L.LOSS_AGG_MODES:
        # The same value as without them (the hand values above), not merely a finite one.
        assert L.aggregate(values, MASK, mode).item() == pytest.approx(L.aggregate(VALUES, MASK, mode).item())


@pytest.mark.parametrize("mode", L.LOSS_AGG_MODES)
def test_split_batch_with_shared_denominator_equals_whole_batch(mode):
    # What the trainer relies on for micro-batching: micro losses with the batch's denominator sum to the batch loss.
    whole = L.aggregate(VALUES, MASK, mode, max_response_len=6)
    den = L.default_denominator(MASK, mode, max_response_len=6)
    parts = sum(L.aggregate(VALUES[rows], MASK[rows], mode, 6, den) for rows in (slice(0, 1), slice(1, 3)))
    assert parts.item() == pytest.approx(whole.item())


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.lists(st.tuples(st.floats(-5, 5), st.integers(0, 1)), min_size=3, max_size=3), min_size=1, max_size=4
    ),
    mode=st.sampled_from(L.LOSS_AGG_MODES),
)
def test_aggregate_matches_loop_property(data, mode):
    values = [[v for v, _ in row] for row in data]
    mask = [[m for _, m in row] for row in data]
    got = L.aggregate(torch.tensor(values, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64), mode)
    assert got.item() == pytest.approx(loop_aggregate(values, mask, mode), abs=1e-9)


@pytest.mark.parametrize("mode", L.LOSS_AGG_MODES)
def test_policy_loss_matches_loop(mode):
    lo, hi, beta = 0.2, 0.28, 0.1
    loss, stats = L.policy_loss(
        LOGP, OLD, ADV, MASK, clip_low=lo, clip_high=hi, loss_agg=mode, ref_logp=REF, kl_coef=beta
    )
    def token_loss(b, t):
        logp, old, adv, ref = LOGP[b, t].item(), OLD[b, t].item(), ADV[b, t].item(), REF[b, t].item()
        return loop_pg(logp, old, adv, lo, hi) + beta * loop_k3(logp, ref)

    per_token = [[token_loss(b, t) for t in range(T)] for b in range(B)]
    assert loss.item() == pytest.approx(loop_aggregate(per_token, _rows(MASK), mode), abs=1e-12)
    kl_tokens = [[loop_k3(LOGP[b, t].item(), REF[b, t].item()) for t in range(T)] for b in range(B)]
    assert stats["kl"].item() == pytest.approx(loop_aggregate(kl_tokens, _rows(MASK), "token-mean"), abs=1e-12)


def test_policy_loss_without_kl_ignores_reference():
    a, _ = L.policy_loss(LOGP, OLD, ADV, MASK, clip_low=0.2, clip_high=0.2, loss_agg="token-mean")
    b, stats = L.policy_loss(
        LOGP, OLD, ADV, MASK, clip_low=0.2, clip_high=0.2, loss_agg="token-mean", ref_logp=REF, kl_coef=0.0
    )
    assert a.item() == b.item()
    assert "kl" not in stats


@pytest.mark.parametrize("mode", L.LOSS_AGG_MODES)
def test_masked_tokens_get_zero_gradient(mode):
    logits = LOGITS.clone().requires_grad_(True)
    logp = L.token_logprobs(logits, LABELS)
    loss, _ = L.policy_loss(
        logp, OLD, ADV, MASK, clip_low=0.2, clip_high=0.2, loss_agg=mode, ref_logp=REF, kl_coef=0.1
    )
    loss.backward()
    per_position = logits.grad.abs().sum(-1)
    assert (per_position[MASK == 0] == 0).all()
    # Some unmasked, unclipped positions must receive gradient, or the check above proves nothing.
    assert (per_position[MASK == 1] > 0).sum() >= 3


# --- advantages --------------------------------------------------------------------------------


def test_group_advantages_hand_example():
    # group 0: rewards 1,0,0,0 -> mean .25, unbiased std .5 -> 1.5, -.5, -.5, -.5; interleaved with group 1.
    rewards = [1.0, 0.0, 0.3, 0.0, 0.7, 0.0]
    groups = [0, 0, 1, 0, 1, 0]
    got = A.group_advantages(rewards, groups)
    want = [1.5, -0.5, -1 / math.sqrt(0.08) * 0.2, -0.5, 1 / math.sqrt(0.08) * 0.2, -0.5]
    assert got.tolist() == pytest.approx(want, rel=1e-5)


def test_group_advantages_dr_grpo_does_not_scale():
    got = A.group_advantages([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0], scale_by_std=False)
    assert got.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_group_advantages_degenerate_groups_are_zero():
    got = A.group_advantages([1.0, 1.0, 1.0, 0.4], [0, 0, 0, 1])
    assert got.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_baseline_advantages_are_the_margin_over_greedy_unscaled():
    # remax: greedy earned 1.0 on prompt 0 and 0.0 on prompt 1; a sample that does what greedy
    # does gets 0, one that fails where greedy succeeds the whole -1.0, no std division.
    got = A.baseline_advantages([1.0, 0.0, 0.0, 1.1], [1.0, 1.0, 0.0, 0.0])
    assert got.tolist() == pytest.approx([0.0, -1.0, 0.0, 1.1])
    with pytest.raises(ValueError, match="4 rewards but 3 baselines"):
        A.baseline_advantages([1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0])


def test_batch_advantages():
    got = A.batch_advantages([1.0, 0.0], mean=0.5, std=0.5, eps=0.0)
    assert got.tolist() == pytest.approx([1.0, -1.0])


def test_turn_level_two_turn_example():
    # One group, two samples, two turns each. Pooled turn rewards [1, 1, 1, 0]: mean .75, std .5
    # -> turn advantages [.5, .5] and [.5, -1.5]. Global rewards 1 and 0: +-1/sqrt(2).
    turn_rewards = [[1.0, 1.0], [1.0, 0.0]]
    turn_adv = A.turn_advantages(turn_rewards, [0, 0])
    assert turn_adv[0] == pytest.approx([0.5, 0.5], rel=1e-5)
    assert turn_adv[1] == pytest.approx([0.5, -1.5], rel=1e-5)

    seq_adv = A.group_advantages([1.0, 0.0], [0, 0])
    g = 1 / math.sqrt(2)
    assert seq_adv.tolist() == pytest.approx([g, -g], rel=1e-5)

    # turn 0 = 2 tokens, an observation token (mask 0), turn 1 = 2 tokens; then padding.
    turn_index = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 0]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 1, 0, 1, 1, 0]])
    w = 0.5
    got = A.token_advantages(seq_adv, mask, turn_index, turn_adv, w)
    want = [
        [w * 0.5 + g, w * 0.5 + g, 0.0, w * 0.5 + g, w * 0.5 + g, 0.0],
        [w * 0.5 - g, w * 0.5 - g, 0.0, w * -1.5 - g, w * -1.5 - g, 0.0],
    ]
    for got_row, want_row in zip(got.tolist(), want):
        assert got_row == pytest.approx(want_row, rel=1e-5, abs=1e-6)


def test_token_advantages_without_turns_broadcast_and_mask():
    got = A.token_advantages(torch.tensor([2.0, -1.0]), torch.tensor([[1, 0, 1], [0, 1, 0]]))
    assert got.tolist() == [[2.0, 0.0, 2.0], [0.0, -1.0, 0.0]]


def test_samples_without_turn_rewards_get_only_global_part():
    turn_adv = A.turn_advantages([[1.0, 0.0], None], [0, 0])
    assert turn_adv[1] == []
    got = A.token_advantages(torch.tensor([1.0, -1.0]), torch.ones(2, 2), torch.tensor([[0, 1], [0, 1]]), turn_adv, 1.0)
    assert got[1].tolist() == [-1.0, -1.0]
    assert got[0].tolist() == pytest.approx([1.0 + 1 / math.sqrt(2), 1.0 - 1 / math.sqrt(2)], rel=1e-5)
