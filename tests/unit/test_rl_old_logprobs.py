"""Old log-probs from the update's own forward (`old_logprobs_from_update`): with one update per
step (every default recipe) the trainer skips its separate scoring pass of the policy, and the
run it produces is the run the scoring pass produced: the same log records (loss, KL, entropy,
gradient norm) and the same weights, on the toy task of tests/rl_toy.py.
"""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load_file

import rl_toy
from ragrl.train import rl as rl_mod
from ragrl.train.rl import RLConfig, old_logprobs_from_update, train_rl


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with rl_toy.one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return rl_toy.build_model(tmp_path_factory.mktemp("old") / "tiny")


def test_only_one_update_per_step_takes_its_own_log_probs():
    assert old_logprobs_from_update(RLConfig())
    assert not old_logprobs_from_update(RLConfig(ppo_epochs=2))
    assert not old_logprobs_from_update(RLConfig(num_mini_batches=2))
    ppo = RLConfig(algorithm="ppo", use_kl_in_reward=True, kl_coef=0.01)
    assert old_logprobs_from_update(ppo)  # no critic passed: the KL is not needed before the update
    assert not old_logprobs_from_update(ppo, critic=object())  # the advantages need the KL first
    assert old_logprobs_from_update(RLConfig(algorithm="ppo"), critic=object())


def _run(model_dir, out, monkeypatch, separate_pass: bool, chunk: int, tied: bool = False):
    prompts = rl_toy.make_prompts(model_dir, n=2)
    inner = rl_toy.make_rollout(list(range(0, 150)), max_new_tokens=6)

    def rollout(batch, n, model, step_no):
        # Rewards that differ inside every group, so every step updates (see test_rl_mini_batches);
        # or all equal, so every group ties and no step updates.
        return [dataclasses.replace(s, reward=0.5 if tied else s.stats["searches"] / max(len(s.response_ids), 1)
                                    + 1e-3 * (i % n))
                for i, s in enumerate(inner(batch, n, model, step_no))]

    scored = []
    real_score = rl_mod.score
    monkeypatch.setattr(rl_mod, "score", lambda model, *a, **k: scored.append(model) or real_score(model, *a, **k))
    if separate_pass:
        monkeypatch.setattr(rl_mod, "old_logprobs_from_update", lambda cfg, critic=None: False)
    # Two micro-batches of 4 rows: the scoring pass and the update see the same rows together.
    cfg = RLConfig(steps=3, batch_prompts=2, group_size=4, micro_batch_size=4, lr=0.01, kl_coef=0.05, seed=3,
                   checkpoint_every=10, temperature=0.9, logprob_chunk_tokens=chunk, filter_tied_groups=True)
    final = train_rl(model_dir, None, prompts, rollout, cfg, out)
    monkeypatch.undo()
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return log, load_file(str(final / "model.safetensors")), len(scored)


def test_a_step_without_an_update_still_logs_kl_and_entropy(model_dir, tmp_path, monkeypatch):
    # Every group ties: no update runs, so the policy is scored for the log after all.
    got, _, got_passes = _run(model_dir, tmp_path / "own", monkeypatch, False, 5, tied=True)
    want, _, want_passes = _run(model_dir, tmp_path / "pass", monkeypatch, True, 5, tied=True)
    assert (got_passes, want_passes) == (6, 6) and [r["tied_group_share"] for r in got] == [1.0] * 3
    for g, w in zip(got, want):
        assert g["kl"] == w["kl"] == 0.0 and g["entropy"] == pytest.approx(w["entropy"], rel=1e-6) and w["entropy"] > 0.1


@pytest.mark.parametrize("chunk", [0, 5])
def test_the_run_equals_the_run_with_a_scoring_pass(model_dir, tmp_path, monkeypatch, chunk):
    got, got_weights, got_passes = _run(model_dir, tmp_path / "own", monkeypatch, False, chunk)
    want, want_weights, want_passes = _run(model_dir, tmp_path / "pass", monkeypatch, True, chunk)
    assert (got_passes, want_passes) == (3, 6)  # the reference's pass each step; the policy's too before
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        for key in ("reward_mean", "loss", "kl", "entropy", "grad_norm", "clip_frac", "response_length"):
            assert g[key] == pytest.approx(w[key], rel=1e-6, abs=1e-9), (w["step"], key)
    assert want[2]["kl"] > 1e-4 and want[0]["entropy"] > 0.1  # the logged statistics were compared
    assert got_weights.keys() == want_weights.keys()
    for name, tensor in want_weights.items():
        torch.testing.assert_close(got_weights[name], tensor, rtol=0, atol=1e-6, msg=name)
    # and the run moved the weights (an update that did nothing would compare equal too)
    start = load_file(str(model_dir / "model.safetensors"))
    assert max((want_weights[k] - start[k]).abs().max().item() for k in start) > 1e-3
