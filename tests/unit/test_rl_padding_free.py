"""RL's update and log-prob passes over one unpadded row per micro-batch (rl.padding_free): the
packed row holds exactly each sample's tokens, and the log-probs, loss, gradients and critic
values equal the padded batch's; one run of the real trainer logs the same records either way;
and a checkpoint written from a packed run loads as a plain model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

import rl_toy
from ragrl.train import packed_attention
from ragrl.train import rl as rl_mod
from ragrl.train.rl import RLConfig, Sample, collate, critic_values, pack, response_logprobs, train_rl

@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with rl_toy.one_torch_thread():
        yield


def _samples(vocab=97):
    # Different prompt and response lengths (left and right padding in the padded batch), a
    # response of observations only (loss mask all 0) and an empty response.
    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(1, vocab, (n,), generator=g).tolist()  # noqa: E731
    shapes = [(3, 6, [1, 1, 0, 0, 1, 1]), (5, 2, [1, 1]), (2, 4, [0, 0, 0, 0]), (4, 0, []), (1, 5, [1] * 5)]
    return [Sample(prompt_ids=ids(p), response_ids=ids(r), loss_mask=m, turn_index=[0] * r, reward=0.0, group=0)
            for p, r, m in shapes]


def test_pack_holds_each_sample_once_and_gathers_the_predicting_positions():
    samples = _samples()
    packed = pack(collate(samples, pad_id=0))
    want = [t for s in samples for t in s.prompt_ids + s.response_ids]
    assert packed["input_ids"].tolist() == [want]
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    assert packed["position_ids"].tolist() == [[i for n in lengths for i in range(n)]]
    assert packed["cu_seq_lens"].tolist() == [0, 9, 16, 22, 26, 32]
    assert packed["cu_seq_lens"].dtype == torch.int32 and int(packed["max_length"]) == 9
    # The position after each kept one holds the response token it predicts, sample by sample.
    row = packed["input_ids"][0]
    assert row[packed["positions"] + 1].tolist() == [t for s in samples for t in s.response_ids]
    ends = packed["cu_seq_lens"][1:].tolist()
    for i, s in enumerate(samples):  # each sample's predicting positions lie within it
        mine = [p for p in packed["positions"].tolist() if (ends[i - 1] if i else 0) <= p < ends[i]]
        assert len(mine) == len(s.response_ids)
    assert "attention_mask" not in packed and packed["response_ids"].shape == (5, 6)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk", [0, 7])
def test_packed_logprobs_loss_and_gradients_equal_the_padded_batch(tied, chunk, monkeypatch):
    model = rl_toy.tiny_qwen2(tied, attn=packed_attention.register()).train()
    batch = collate(_samples(), pad_id=0)
    want_logp, want_loss, want_grads = rl_toy.logp_loss_grads(model, batch, chunk, loss_agg="grpo")
    calls = []
    real = packed_attention.packed_bounds
    monkeypatch.setattr(packed_attention, "packed_bounds", lambda *a: calls.append(b := real(*a)) or b)
    logp, loss, grads = rl_toy.logp_loss_grads(model, pack(batch), chunk, loss_agg="grpo")
    # Both layers attended one sequence at a time, within the samples' bounds.
    assert calls == [[0, 9, 16, 22, 26, 32]] * 2
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(logp[mask], want_logp[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-6)
    assert grads.keys() == want_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert loss.abs() > 1e-3 and grads["model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0


def test_a_packed_forward_builds_no_attention_mask(monkeypatch):
    # transformers would read the packing off the position ids and build an L x L block mask that
    # the per-sequence attention never reads (half of a forward's time at the toy's sizes).
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    name = packed_attention.register()
    masks = []
    real = ALL_MASK_ATTENTION_FUNCTIONS[name]
    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, name,
                        lambda *a, **k: masks.append(m := real(*a, **k)) or m)
    model = rl_toy.tiny_qwen2(True, attn=name).eval()
    batch = collate(_samples(), pad_id=0)
    with torch.no_grad():
        response_logprobs(model, batch, 1.0, 0, False, contextlib.nullcontext)
        assert len(masks) == 1 and masks[0] is not None  # the padded batch needs its padding mask
        response_logprobs(model, pack(batch), 1.0, 0, False, contextlib.nullcontext)
    assert len(masks) == 2 and masks[1] is None


def test_a_sliding_window_model_keeps_its_packed_sequences_apart():
    # Its layers cannot attend per sequence: given an all-ones mask, transformers' sliding mask would
    # let each sample's first tokens see the end of the sample before it (log-probs 0.1 off).
    model = rl_toy.tiny_qwen2(True, attn=packed_attention.register(), use_sliding_window=True, sliding_window=4,
                              max_window_layers=0).eval()
    assert model.config.layer_types == ["sliding_attention"] * 2
    batch = collate(_samples(), pad_id=0)
    with torch.no_grad():
        want, _ = response_logprobs(model, batch, 1.0, 0, False, contextlib.nullcontext)
        got, _ = response_logprobs(model, pack(batch), 1.0, 0, False, contextlib.nullcontext)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk", [0, 7])
def test_packed_entropy_equals_the_padded_batch(chunk):
    model = rl_toy.tiny_qwen2(True, attn=packed_attention.register()).eval()
    batch = collate(_samples(), pad_id=0)
    with torch.no_grad():
        want = response_logprobs(model, batch, 1.3, chunk, True, contextlib.nullcontext)
        got = response_logprobs(model, pack(batch), 1.3, chunk, True, contextlib.nullcontext)
    mask = batch["response_mask"].bool()
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g[mask], w[mask], rtol=0, atol=1e-5)
        assert (g[~mask] == 0).all()


@pytest.mark.parametrize("chunk", [0, 7])
def test_a_micro_batch_of_empty_responses_backpropagates_zeros(chunk):
    # A prompt that fills the context leaves its samples without a response; a packed micro-batch
    # of only such rows has no response position at all, and its loss must still backpropagate.
    model = rl_toy.tiny_qwen2(True, attn=packed_attention.register()).train()
    samples = [dataclasses.replace(s, response_ids=[], loss_mask=[], turn_index=[]) for s in _samples()[:2]]
    logp, loss, grads = rl_toy.logp_loss_grads(model, pack(collate(samples, pad_id=0)), chunk)
    assert logp.shape == (2, 1) and (logp == 0).all() and float(loss) == 0.0
    assert all((g == 0).all() for g in grads.values())


def test_packed_critic_values_equal_the_padded_batch(monkeypatch):
    critic = rl_toy.tiny_qwen2(False, attn=packed_attention.register(), cls=transformers.Qwen2ForTokenClassification,
                               num_labels=1).eval()
    batch = collate(_samples(), pad_id=0)
    calls = []
    real = packed_attention.packed_bounds
    monkeypatch.setattr(packed_attention, "packed_bounds", lambda *a: calls.append(b := real(*a)) or b)
    with torch.no_grad():
        want = critic_values(critic, batch)
        assert calls == [None, None]  # the padded batch: transformers' SDPA
        got = critic_values(critic, pack(batch))
    assert calls[2:] == [[0, 9, 16, 22, 26, 32]] * 2  # the value model attended per sequence too
    mask = batch["response_mask"].bool()
    assert got.shape == want.shape
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-5)


# --- the trainer ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return rl_toy.build_model(tmp_path_factory.mktemp("packed") / "tiny")


def _run(model_dir, out, padding_free: bool, algorithm="grpo"):
    prompts = rl_toy.make_prompts(model_dir, n=2)
    inner = rl_toy.make_rollout(list(range(0, 150)), max_new_tokens=6)

    def rollout(batch, n, model, step_no):
        # Rewards that differ inside every group, so every step updates (test_rl_chunked_logprobs).
        return [dataclasses.replace(s, reward=s.stats["searches"] / max(len(s.response_ids), 1) + 1e-3 * (i % n))
                for i, s in enumerate(inner(batch, n, model, step_no))]

    extra = {"filter_tied_groups": False} if algorithm == "ppo" else {}
    cfg = RLConfig(algorithm=algorithm, steps=2, batch_prompts=2, group_size=4, num_mini_batches=2,
                   micro_batch_size=3, ppo_epochs=2, lr=0.01, kl_coef=0.05, seed=3, checkpoint_every=1,
                   temperature=0.9, padding_free=padding_free, **extra)
    train_rl(model_dir, None, prompts, rollout, cfg, out)
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rl_steps_log_the_same_records_padding_free(model_dir, tmp_path, monkeypatch, algorithm):
    padded = _run(model_dir, tmp_path / "padded", False, algorithm)
    packs = []
    real = rl_mod.pack
    monkeypatch.setattr(rl_mod, "pack", lambda b: packs.append(len(b["input_ids"])) or real(b))
    packed = _run(model_dir, tmp_path / "packed", True, algorithm)
    assert packs and set(packs) == {2}  # micro-batches of 2 rows (4 a mini-batch, at most 3 a micro-batch) went in packed
    assert len(padded) == len(packed) == 2
    keys = ["loss", "kl", "grad_norm", "entropy", "clip_frac", "reward_mean"]
    if algorithm == "ppo":
        keys += ["value_loss", "critic_grad_norm"]
    for want, got in zip(padded, packed):
        assert want["response_length"] == got["response_length"]  # the same rollouts
        for key in keys:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-5), (want["step"], key)
    assert padded[0]["grad_norm"] > 1e-3 and padded[1]["kl"] > 1e-4  # real updates were compared
