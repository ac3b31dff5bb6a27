"""Log-probs and the policy loss computed a chunk of positions at a time (rl.logprob_chunk_tokens,
issue #38): the same values and the same parameter gradients as the micro-batch's logits at once,
for tied and untied LM heads, with temperature, padding rows and loss masks; and one RL step of
the real trainer logs the same record either way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import rl_toy
from ragrl import progress
from ragrl.train import rl as rl_mod
from ragrl.train.losses import chunked_token_logprobs, entropy_from_logits, token_logprobs
from ragrl.train.rl import RLConfig, Sample, collate, response_logprobs, train_rl

NO_AUTOCAST = contextlib.nullcontext


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with rl_toy.one_torch_thread():
        yield


# --- the pure function -------------------------------------------------------------------------


def _head_problem(seed=0, rows=3, width=7, hidden=16, vocab=53):
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(hidden, vocab, bias=True)
    # Logits of unit scale, as a trained model's: fp32's rounding (which differs with the rows a
    # matmul sees) then stays well under the 1e-6 the tests allow.
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=gen) / hidden**0.5)
        head.bias.copy_(torch.randn(vocab, generator=gen))
    h = torch.randn(rows, width, hidden, generator=gen)
    labels = torch.randint(0, vocab, (rows, width), generator=gen)
    return head, h, labels


@pytest.mark.parametrize("chunk", [0, 1, 4, 7, 21, 25])  # 21 = rows x width; 4 divides neither
def test_chunked_values_and_entropy_equal_the_full_logits(chunk):
    head, h, labels = _head_problem()
    with torch.no_grad():
        logits = head(h)
        want_logp = token_logprobs(logits, labels, 0.7)
        want_ent = entropy_from_logits(logits, 0.7)
        logp, ent = chunked_token_logprobs(h, head, labels, 0.7, chunk, with_entropy=True)
    assert logp.shape == ent.shape == labels.shape
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, want_ent, rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 4, 7, 0])
def test_chunked_gradients_equal_the_full_logits(chunk):
    head, h, labels = _head_problem(seed=1)
    mask = (torch.rand(labels.shape, generator=torch.Generator().manual_seed(2)) > 0.3).float()
    weights = torch.randn(labels.shape, generator=torch.Generator().manual_seed(3))

    def grads(fn):
        head.zero_grad()
        hh = h.clone().requires_grad_(True)
        logp = fn(hh)
        ((logp * weights) * mask).sum().backward()
        return [hh.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()]

    want = grads(lambda hh: token_logprobs(head(hh), labels, 0.7))
    got = grads(lambda hh: chunked_token_logprobs(hh, head, labels, 0.7, chunk)[0])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_chunks_run_checkpointed_with_gradients():
    # The training pass must not keep every chunk's logits for the backward: each chunk's head
    # runs a second time in the backward (recomputation) instead.
    head, h, labels = _head_problem()
    calls = []
    counted = lambda x: calls.append(x.shape[0]) or head(x)  # noqa: E731
    logp, _ = chunked_token_logprobs(h.requires_grad_(True), counted, labels, 1.0, 8)
    assert calls == [8, 8, 5]
    logp.sum().backward()
    assert sorted(calls) == [5, 5, 8, 8, 8, 8]


def test_entropy_with_gradients_is_logged_outside_the_graph():
    # The update's own pass logs the entropy (old_logprobs_from_update): the values equal the
    # no-grad pass's, carry no gradient, and the backward does not recompute their heads.
    head, h, labels = _head_problem()
    with torch.no_grad():
        want_logp, want_ent = chunked_token_logprobs(h, head, labels, 0.7, 8, with_entropy=True)
    calls = []
    counted = lambda x: calls.append(x.shape[0]) or head(x)  # noqa: E731
    logp, ent = chunked_token_logprobs(h.clone().requires_grad_(True), counted, labels, 0.7, 8, with_entropy=True)
    assert torch.equal(logp.detach(), want_logp) and torch.equal(ent, want_ent)
    assert logp.requires_grad and not ent.requires_grad
    assert sorted(calls) == [5, 5, 8, 8, 8, 8]  # the log-prob chunks and the entropy chunks
    logp.sum().backward()
    assert len(calls) == 9  # the backward recomputed the three log-prob chunks only


# --- on a model: response_logprobs ------------------------------------------------------------


def _model(tied: bool, vocab=97, seed=0):
    return rl_toy.tiny_qwen2(tied, vocab, seed)


def _batch(vocab=97):
    # Different prompt and response lengths (left and right padding), one response of observations
    # only (loss mask all 0) and one empty response: a padding row.
    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(1, vocab, (n,), generator=g).tolist()  # noqa: E731
    shapes = [(3, 6, [1, 1, 0, 0, 1, 1]), (5, 2, [1, 1]), (2, 4, [0, 0, 0, 0]), (4, 0, [])]
    samples = [Sample(prompt_ids=ids(p), response_ids=ids(r), loss_mask=m, turn_index=[0] * r, reward=0.0, group=0)
               for p, r, m in shapes]
    return collate(samples, pad_id=0)


@pytest.mark.parametrize("tied", [True, False])
# 24 positions = 4 rows x 6: 5 does not divide them; 8 does but its chunks straddle rows; 1000 is one chunk
@pytest.mark.parametrize("chunk", [1, 5, 8, 24, 1000])
def test_model_logprobs_loss_and_gradients_equal_unchunked(tied, chunk):
    model = _model(tied).train()
    batch = _batch()
    want_logp, want_loss, want_grads = rl_toy.logp_loss_grads(model, batch, 0)
    logp, loss, grads = rl_toy.logp_loss_grads(model, batch, chunk)
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=1e-6)
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-6)
    assert grads.keys() == want_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    # The loss reached the LM head through the chunks, not only through the body.
    head_grad = grads["lm_head.weight" if not tied else "model.embed_tokens.weight"]
    assert head_grad.abs().sum() > 0


def test_scoring_with_entropy_equals_unchunked():
    model = _model(True).eval()
    batch = _batch()
    with torch.no_grad():
        want = response_logprobs(model, batch, 1.3, 0, True, NO_AUTOCAST)
        got = response_logprobs(model, batch, 1.3, 5, True, NO_AUTOCAST)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_chunked_under_bf16_autocast_runs_the_head_in_bf16():
    model = _model(False).eval()
    batch = _batch()
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    dtypes = []
    hook = model.lm_head.register_forward_hook(lambda m, a, out: dtypes.append(out.dtype))
    with torch.no_grad():
        want, _ = response_logprobs(model, batch, 1.0, 0, False, autocast)
        got, _ = response_logprobs(model, batch, 1.0, 7, False, autocast)
        chunked_dtypes, dtypes[:] = dtypes[1:], []
        fp32, _ = response_logprobs(model, batch, 1.0, 7, False, NO_AUTOCAST)
    hook.remove()
    # the model's own call on one position, the check, and 24 positions in chunks of 7
    assert chunked_dtypes == [torch.bfloat16] * 6
    assert dtypes == [torch.float32] * 6
    # Both read bf16 logits; chunking only changes which rows share a matmul.
    torch.testing.assert_close(got, want, rtol=0, atol=2e-2)
    assert (got - fp32).abs().max() > 1e-4  # autocast did change the numbers: the check has teeth


class _ScaledLogits(torch.nn.Module):
    """A model whose logits are its head's output scaled afterwards (as Cohere's logit_scale)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, **kwargs):
        return SimpleNamespace(logits=self.inner(**kwargs).logits * 0.5)


def test_a_model_that_transforms_its_logits_after_the_head_is_refused():
    model = _ScaledLogits(_model(True))
    with pytest.raises(RuntimeError, match="logprob_chunk_tokens: 0"):
        response_logprobs(model, _batch(), 1.0, 4, False, NO_AUTOCAST)
    # Unchunked it reads the model's own logits.
    logp, _ = response_logprobs(model, _batch(), 1.0, 0, False, NO_AUTOCAST)
    assert torch.isfinite(logp).all()


def test_chunkable_head_unwraps_and_refuses_zero3():
    model = _model(True)
    wrapped = SimpleNamespace(module=model, zero_optimization_stage=lambda: 2)
    assert rl_mod.chunkable_head(wrapped) is model.lm_head
    assert rl_mod.chunkable_head(SimpleNamespace(module=model, zero_optimization_stage=lambda: 3)) is None
    assert rl_mod.chunkable_head(model) is model.lm_head


class _Zero3Like(torch.nn.Module):
    """A wrapper as DeepSpeed's ZeRO-3 engine looks to `chunkable_head`: `.module` and stage 3."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def zero_optimization_stage(self):
        return 3

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_unchunkable_head_says_so_once_and_scores_the_same(capsys, monkeypatch):
    monkeypatch.setattr(progress, "_NOTED", set())
    model = _model(True).eval()
    with torch.no_grad():
        want, _ = response_logprobs(model, _batch(), 1.0, 0, False, NO_AUTOCAST)
        assert "logprob_chunk_tokens" not in capsys.readouterr().err  # chunking off: nothing to say
        for _ in range(3):
            got, _ = response_logprobs(_Zero3Like(model), _batch(), 1.0, 5, False, NO_AUTOCAST)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert capsys.readouterr().err.count("materialises its whole [batch, response, vocabulary] logits") == 1


def test_negative_chunk_size_is_refused():
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        RLConfig(logprob_chunk_tokens=-1)


# --- one step of the trainer -------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return rl_toy.build_model(tmp_path_factory.mktemp("chunk") / "tiny")


def _one_step(model_dir, out, chunk):
    prompts = rl_toy.make_prompts(model_dir, n=2)
    inner = rl_toy.make_rollout(list(range(0, 150)), max_new_tokens=6)

    def rollout(batch, n, model, step_no):
        # Rewards that differ inside every group (as in test_rl_mini_batches): with all-zero
        # advantages the only gradient is the rounding noise between two groupings of rows, which
        # Adam's normalisation blows up to full-size steps, in either mode.
        return [dataclasses.replace(s, reward=s.stats["searches"] / max(len(s.response_ids), 1) + 1e-3 * (i % n))
                for i, s in enumerate(inner(batch, n, model, step_no))]

    # micro-batches of 3 rows over a 4-row mini-batch: one micro-batch with a row fewer; the eos
    # cut-off leaves padding in the responses.
    cfg = RLConfig(steps=2, batch_prompts=2, group_size=4, num_mini_batches=2, micro_batch_size=3, ppo_epochs=2,
                   lr=0.01, kl_coef=0.05, seed=3, checkpoint_every=10, temperature=0.9,
                   logprob_chunk_tokens=chunk)
    train_rl(model_dir, None, prompts, rollout, cfg, out)
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_rl_steps_log_the_same_records_chunked(model_dir, tmp_path, monkeypatch):
    # Two steps, so that the second step's KL (old policy against the reference) is not zero.
    full = _one_step(model_dir, tmp_path / "full", 0)
    # The trainer's model really went through the chunks (a silent fall-back to the whole logits,
    # e.g. a head chunkable_head does not find, would log the same records).
    chunk_sizes = []
    real = rl_mod.chunked_token_logprobs
    monkeypatch.setattr(rl_mod, "chunked_token_logprobs",
                        lambda *a, **k: chunk_sizes.append(a[4]) or real(*a, **k))
    chunked = _one_step(model_dir, tmp_path / "chunked", 5)
    assert chunk_sizes and set(chunk_sizes) == {5}
    assert len(full) == len(chunked) == 2
    for want, got in zip(full, chunked):
        assert want["response_length"] == got["response_length"]  # the same rollouts
        # abs 1e-5: step 2's loss is a near-cancelling sum (-4.3e-4 from terms of ~0.1), and the
        # chunked reduction order after one update at lr 1e-2 moved it by 1.3e-6 in a CI run; a
        # misaligned chunk or a dropped token moves it by the loss's own size.
        for key in ("loss", "kl", "grad_norm", "entropy", "clip_frac", "reward_mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-5), (want["step"], key)
    assert full[0]["grad_norm"] > 1e-3 and full[0]["loss"] != 0.0  # real updates were compared
    assert full[1]["kl"] > 1e-4
