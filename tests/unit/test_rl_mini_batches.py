"""Several updates per step (ppo_epochs x num_mini_batches), as the paper configs take them: the
old log-probs are the rollout policy's for every mini-batch and every epoch, the ratio is exactly 1
on the first mini-batch and has moved on the later ones, and the clip cuts the gradient of the
tokens it clips (issue #37, deliverable 2).

One step of the real trainer (`train_rl`) on the toy task of tests/rl_toy.py, with
`ragrl.train.rl.policy_loss` wrapped to record what each mini-batch's loss sees; a few seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import rl_toy
from ragrl.train import rl as rl_mod
from ragrl.train.rl import RLConfig, collate, score, train_rl

# 2 prompts x 4 samples = 8 sequences per step in 4 mini-batches of 2, twice (2 epochs): 8 updates.
EPOCHS, MINI_BATCHES = 2, 4
CLIP = 0.05


@pytest.fixture(scope="module")
def one_thread():
    with rl_toy.one_torch_thread():
        yield


@pytest.fixture(scope="module")
def step(tmp_path_factory, one_thread):
    """Run one step; returns (calls, samples, model_dir, log). Each call records one micro-batch of
    the update: ratio inputs, advantages, mask, which tokens the clip cut, and d loss / d logp."""
    model_dir = rl_toy.build_model(tmp_path_factory.mktemp("mini") / "tiny")
    prompts = rl_toy.make_prompts(model_dir, n=2)
    inner = rl_toy.make_rollout(list(range(0, 200)), max_new_tokens=6)
    samples_seen = []

    def rollout(batch, n, model, step_no):
        # A reward that differs inside every group (the share of tokens in the target half of the
        # vocabulary, plus 1e-3 x the sample's place in its group, so no reward equals its group's
        # mean): every sequence has a non-zero advantage.
        out = [dataclasses.replace(s, reward=s.stats["searches"] / max(len(s.response_ids), 1) + 1e-3 * (i % n))
               for i, s in enumerate(inner(batch, n, model, step_no))]
        samples_seen.extend(out)
        return out

    calls = []
    real_loss = rl_mod.policy_loss

    def recording_loss(logp, old_logp, advantages, mask, **kwargs):
        record = {"logp": logp.detach().clone(), "old_logp": old_logp.detach().clone(),
                  "advantages": advantages.detach().clone(), "mask": mask.detach().clone()}
        low, high = 1.0 - kwargs["clip_low"], 1.0 + kwargs["clip_high"]
        ratio = torch.exp(logp.detach() - old_logp)
        # The clip binds where clip(r) A < r A: r above 1 + eps with A > 0, r below 1 - eps with A < 0.
        record["clipped"] = ((ratio > high) & (advantages > 0)) | ((ratio < low) & (advantages < 0))
        if logp.requires_grad:
            logp.register_hook(lambda g: record.__setitem__("grad", g.detach().clone()))
        calls.append(record)
        return real_loss(logp, old_logp, advantages, mask, **kwargs)

    cfg = RLConfig(steps=1, batch_prompts=2, group_size=4, ppo_epochs=EPOCHS, num_mini_batches=MINI_BATCHES,
                   micro_batch_size=1, lr=0.01, clip_eps=CLIP, kl_coef=0.0, seed=0, checkpoint_every=10,
                   log_entropy=False)
    out = tmp_path_factory.mktemp("mini_run")
    mp = pytest.MonkeyPatch()
    mp.setattr(rl_mod, "policy_loss", recording_loss)
    try:
        train_rl(model_dir, None, prompts, rollout, cfg, out)
    finally:
        mp.undo()
    return calls, samples_seen, model_dir


def _rows(calls, mini_batch):
    """The records of one mini-batch (micro-batches of one sequence: 2 per mini-batch)."""
    per_mini = len(calls) // (EPOCHS * MINI_BATCHES)
    return calls[mini_batch * per_mini:(mini_batch + 1) * per_mini]


def test_every_mini_batch_of_every_epoch_is_an_update(step):
    calls, samples, _ = step
    assert len(samples) == 8
    assert len(calls) == 16  # 2 epochs x 4 mini-batches x 2 micro-batches of one sequence
    assert all(c["mask"].sum() > 0 and (c["advantages"][c["mask"] > 0] != 0).all() for c in calls)


def test_ratio_is_exactly_one_on_the_first_mini_batch_and_moves_after(step):
    calls, _, _ = step
    for c in _rows(calls, 0):  # nothing has been updated yet: the policy is the rollout policy
        mask = c["mask"] > 0
        assert torch.equal(c["logp"][mask], c["old_logp"][mask])
        assert not c["clipped"][mask].any()
    for k in range(1, EPOCHS * MINI_BATCHES):  # after k optimizer steps the ratio has moved
        moved = max(float((c["logp"] - c["old_logp"])[c["mask"] > 0].abs().max()) for c in _rows(calls, k))
        assert moved > 1e-3, (k, moved)


def test_old_log_probs_are_the_rollout_policys_in_every_mini_batch_and_epoch(step):
    # Every row's old log-probs, in whichever mini-batch and epoch it comes, are the initial
    # model's log-probs of that sample (scored afresh here), not those of the policy after the
    # previous mini-batch: the ratio compares with the policy that generated the step.
    calls, samples, model_dir = step
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = model.generation_config.pad_token_id
    batch = collate(samples, pad)
    initial, _ = score(model, batch, torch.arange(len(samples)).split(1), 1.0, "cpu", False, contextlib.nullcontext)
    width = batch["response_ids"].shape[1]
    seen = []
    for c in calls:
        old = c["old_logp"][0]
        assert old.shape[0] == width
        match = [i for i in range(len(samples)) if torch.equal(old, initial[i])]
        assert match, "a mini-batch's old log-probs are not the rollout policy's"
        seen.append(match[0])
    # Each epoch visits every sequence exactly once, in a fresh order.
    half = len(calls) // EPOCHS
    assert sorted(seen[:half]) == sorted(seen[half:]) == list(range(len(samples)))


def test_clipped_tokens_get_no_gradient_and_the_others_do(step):
    calls, _, _ = step
    clipped = free = 0
    for c in calls:
        mask = c["mask"] > 0
        grad = c["grad"]
        cut = c["clipped"] & mask
        assert (grad[cut] == 0).all(), "a clipped token got a gradient"
        assert (grad[mask & ~c["clipped"]] != 0).all(), "an unclipped token with A != 0 got no gradient"
        assert (grad[~mask] == 0).all(), "a padding token got a gradient"
        clipped += int(cut.sum())
        free += int((mask & ~c["clipped"]).sum())
    # With lr 0.01 and a clip of 0.05 the later mini-batches leave the trust region on many tokens.
    assert clipped > 0 and free > 0, (clipped, free)


def test_mini_batches_split_in_rollout_order_unless_shuffled():
    # The verl forks split a step's batch in order (batch.split; verl's actor.shuffle false): whole
    # groups in each mini-batch. Shuffled, the split is a seeded permutation.
    from ragrl.train.rl import mini_batch_order

    gen = torch.Generator().manual_seed(0)
    in_order = RLConfig(num_mini_batches=4, shuffle_mini_batches=False)
    assert mini_batch_order(8, in_order, gen).tolist() == list(range(8))
    shuffled = mini_batch_order(8, RLConfig(num_mini_batches=4), torch.Generator().manual_seed(0))
    assert sorted(shuffled.tolist()) == list(range(8)) and shuffled.tolist() != list(range(8))
    assert mini_batch_order(8, RLConfig(num_mini_batches=1), gen).tolist() == list(range(8))
