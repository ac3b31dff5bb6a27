"""algorithm ppo: PPO with a learned critic (GAE over the policy's tokens, clipped value loss, KL in
the reward or as a loss). Hand-computed GAE and value-loss numbers, a toy task that learns, and a
killed run that resumes policy *and* critic exactly. The toy task lives in tests/rl_toy.py."""

from __future__ import annotations

import json
import os

# Before transformers is imported: nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rl_toy
from ragrl.train import advantages as adv
from ragrl.train import checkpoint as ckpt
from ragrl.train.losses import kl_k1, value_loss
from ragrl.train.rl import LOG_NAME, RLConfig, train_rl

REPO = Path(__file__).resolve().parents[2]
TOY_SCRIPT = REPO / "tests" / "rl_toy.py"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with rl_toy.one_torch_thread():
        yield


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    model_dir = rl_toy.build_model(tmp_path_factory.mktemp("ppo") / "tiny")
    prompts = rl_toy.make_prompts(model_dir)
    target = int(rl_toy.initial_token_probs(model_dir, prompts).argmax())
    return model_dir, prompts, target


def _log(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / LOG_NAME).read_text().splitlines()]


# --- GAE over policy tokens, by hand --------------------------------------------------------------

# One episode of 7 response positions: two policy tokens, two observation tokens (retrieved text),
# two policy tokens, one padding position.
#   position    0    1    2    3    4    5    6
#   kind        a    a    obs  obs  a    a    pad
MASK = torch.tensor([[1, 1, 0, 0, 1, 1, 0]], dtype=torch.float32)
# The critic's values; 9.0 on the observations and the padding, which GAE must never read.
VALUES = torch.tensor([[0.5, 0.6, 9.0, 9.0, 0.7, 0.8, 9.0]])


def test_score_lands_on_the_last_policy_token_and_kl_on_every_policy_token():
    kl = torch.tensor([[0.1, -0.2, 5.0, 5.0, 0.3, 0.0, 5.0]])
    rewards = adv.token_level_rewards([1.0], MASK, kl, kl_coef=0.5)
    # -0.5 * kl on policy tokens: -0.05, +0.1, -0.15, -0.0; the score 1.0 on position 5.
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.1, 0.0, 0.0, -0.15, 1.0, 0.0]]))
    # A rollout cut off after a search ends on an observation: the score goes to its last *policy*
    # token (position 1), where GAE can see it. A sample without policy tokens gets nothing.
    cut = torch.tensor([[1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    assert adv.token_level_rewards([2.0, 3.0], cut).tolist() == [[0, 2.0, 0, 0, 0, 0, 0], [0] * 7]


def test_gae_skips_observation_tokens_hand_computed():
    rewards = adv.token_level_rewards([1.0], MASK)  # 1.0 on position 5
    advantages, returns = adv.gae_advantages_returns(rewards, VALUES, MASK, gamma=0.9, lam=0.8)
    # The recursion runs over the policy tokens 0, 1, 4, 5 as if the observations were absent;
    # gamma * lam = 0.72, and V after the last policy token is 0:
    #   t=5: delta = 1 + 0.9*0   - 0.8 = 0.2    A5 = 0.2
    #   t=4: delta = 0 + 0.9*0.8 - 0.7 = 0.02   A4 = 0.02 + 0.72*0.2     = 0.164
    #   t=1: delta = 0 + 0.9*0.7 - 0.6 = 0.03   A1 = 0.03 + 0.72*0.164   = 0.14808     (next policy token: 4)
    #   t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04   A0 = 0.04 + 0.72*0.14808 = 0.1466176
    # Returns A + V: 0.6466176, 0.74808, 0.864, 1.0. Observations and padding: 0 for both.
    torch.testing.assert_close(advantages, torch.tensor([[0.1466176, 0.14808, 0, 0, 0.164, 0.2, 0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.6466176, 0.74808, 0, 0, 0.864, 1.0, 0]]))


def test_gae_with_gamma_and_lambda_one_is_reward_minus_value_on_every_policy_token():
    # verl's defaults (and RAG-R1's): the advantage telescopes to R - V(t) and every return is R,
    # however many observation tokens lie in between.
    rewards = adv.token_level_rewards([1.0], MASK)
    advantages, returns = adv.gae_advantages_returns(rewards, VALUES, MASK, gamma=1.0, lam=1.0)
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.4, 0, 0, 0.3, 0.2, 0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 0, 0, 1.0, 1.0, 0]]))


def test_gae_is_independent_of_what_sits_at_masked_positions():
    rewards = adv.token_level_rewards([1.0], MASK)
    junk = VALUES.clone()
    junk[MASK == 0] = -123.0
    noisy_rewards = rewards.clone()
    noisy_rewards[MASK == 0] = 7.0
    for got, want in zip(adv.gae_advantages_returns(noisy_rewards, junk, MASK, 0.9, 0.8),
                         adv.gae_advantages_returns(rewards, VALUES, MASK, 0.9, 0.8)):
        torch.testing.assert_close(got, want)


def test_masked_whiten_as_verl_and_with_pooled_moments():
    values = torch.tensor([[1.0, 2.0, 50.0], [3.0, -7.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # mask-1 entries 1, 2, 3: mean 2, Bessel variance 1 -> (x - 2) / sqrt(1 + 1e-8); masked -> 0
    torch.testing.assert_close(adv.masked_whiten(values, mask), torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    # Two processes' moments pooled give the whole batch's whitening.
    parts = [adv.masked_moments(values[i : i + 1], mask[i : i + 1]) for i in range(2)]
    pooled = tuple(sum(p[k] for p in parts) for k in range(3))
    torch.testing.assert_close(adv.masked_whiten(values[1:], mask[1:], pooled), torch.tensor([[1.0, 0.0, 0.0]]))
    # A lone token has no spread: centred to 0 (verl raises).
    assert adv.masked_whiten(torch.tensor([[5.0]]), torch.tensor([[1.0]])).tolist() == [[0.0]]


# --- the clipped value loss on fixed tensors --------------------------------------------------------


def test_value_loss_and_its_clip_hand_computed():
    vpreds = torch.tensor([[1.0, 0.4, -0.5, 2.0, 100.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0]])
    returns = torch.tensor([[1.2, 0.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, stats = value_loss(vpreds, old, returns, mask, cliprange_value=0.2)
    # token  v     V_old  R     clip(v, V_old +- 0.2)  (v-R)^2  (clip-R)^2  max
    #   0    1.0   0.5    1.2   0.7                    0.04     0.25        0.25  (clipped term)
    #   1    0.4   0.5    0.0   0.4                    0.16     0.16        0.16
    #   2   -0.5   0.0   -1.0  -0.2                    0.25     0.64        0.64  (clipped term)
    #   3    2.0   0.0    0.0   0.2                    4.0      0.04        4.0   (the clip never lowers the loss)
    #   4    masked
    # loss = 0.5 * (0.25 + 0.16 + 0.64 + 4.0) / 4 = 0.63125; clipped share 2 of 4
    assert float(loss.detach()) == pytest.approx(0.63125)
    assert float(stats["vf_clip_frac"]) == pytest.approx(0.5)
    loss.backward()
    # Where the clipped term wins, the clamp is saturated: no gradient (the update may not move
    # the value further from V_old). Elsewhere d/dv 0.5 * (v - R)^2 / 4 = (v - R) / 4.
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 0.1, 0.0, 0.5, 0.0]]))


def test_kl_k1_is_the_plain_log_ratio():
    assert kl_k1(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])).tolist() == [0.5, -1.0]


@pytest.mark.parametrize("values,needle", [
    ({"algorithm": "grpo", "use_kl_in_reward": True}, "use_kl_in_reward needs algorithm 'ppo'"),
    ({"algorithm": "ppo", "kl_estimator": "k1"}, "kl_estimator 'k1' needs use_kl_in_reward"),
    ({"algorithm": "ppo", "turn_advantage_weight": 0.5}, "no turn_advantage_weight"),
    ({"algorithm": "ppo", "filter_tied_groups": True}, "no filter_tied_groups"),
    ({"algorithm": "ppo", "lam": 1.5}, "must be in [0, 1]"),
    ({"algorithm": "ppo", "cliprange_value": 0.0}, "cliprange_value=0.0 must be > 0"),
])
def test_config_rejects_what_ppo_cannot_do(values, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        RLConfig.from_dict(values)


# --- the same numbers as verl's own functions ----------------------------------------------------

VERL_VENV = os.environ.get("RAGRL_VERL_VENV")

# Run with the verl venv's python: verl's GAE (with its whitening), value loss and k1 KL on the
# tensors of a JSON spec; prints their results as JSON.
VERL_SNIPPET = """
import json, sys, torch
from verl.trainer.ppo.core_algos import compute_gae_advantage_return, compute_value_loss, kl_penalty
spec = json.load(open(sys.argv[1]))
t = {k: torch.tensor(v, dtype=torch.float32) for k, v in spec["tensors"].items()}
adv, ret = compute_gae_advantage_return(t["rewards"], t["values"], t["mask"], spec["gamma"], spec["lam"])
vf_loss, vf_clip = compute_value_loss(t["vpreds"], ret, t["values"], t["mask"], spec["cliprange_value"])
print(json.dumps({"advantages": adv.tolist(), "returns": ret.tolist(), "vf_loss": float(vf_loss),
                  "vf_clip": float(vf_clip), "k1": kl_penalty(t["logp"], t["ref"], "kl").tolist()}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not VERL_VENV, reason="RAGRL_VERL_VENV is unset; `make test` builds .venv-verl and sets it")
def test_gae_whitening_and_value_loss_match_verls_own_functions(tmp_path):
    gen = torch.Generator().manual_seed(0)
    b, t = 4, 12
    mask = (torch.rand(b, t, generator=gen) > 0.35).float()
    mask[:, 0] = 1.0
    mask[1, 8:] = 0.0  # padding
    mask[2, -3:] = 0.0  # a trajectory that ends on an observation
    logp, ref = -torch.rand(b, t, generator=gen), -torch.rand(b, t, generator=gen)
    values = torch.randn(b, t, generator=gen)
    scores = [1.0, 0.0, 0.5, -1.0]
    rewards = adv.token_level_rewards(scores, mask, kl_k1(logp, ref), kl_coef=0.1)
    vpreds = values + 0.8 * torch.randn(b, t, generator=gen)
    settings = {"gamma": 0.97, "lam": 0.9, "cliprange_value": 0.5}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**settings, "tensors": {
        "rewards": rewards.tolist(), "values": values.tolist(), "mask": mask.tolist(), "vpreds": vpreds.tolist(),
        "logp": logp.tolist(), "ref": ref.tolist()}}))
    proc = subprocess.run([str(Path(VERL_VENV) / "bin/python"), "-c", VERL_SNIPPET, str(spec)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verl = json.loads(proc.stdout.strip().splitlines()[-1])

    raw, returns = adv.gae_advantages_returns(rewards, values, mask, settings["gamma"], settings["lam"])
    ours = adv.masked_whiten(raw, mask)
    on = mask > 0  # verl leaves carried-over numbers on masked positions; ours are 0 there
    torch.testing.assert_close(ours[on], torch.tensor(verl["advantages"])[on], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns[on], torch.tensor(verl["returns"])[on], rtol=1e-5, atol=1e-5)
    loss, stats = value_loss(vpreds, values, returns, mask, settings["cliprange_value"])
    assert float(loss) == pytest.approx(verl["vf_loss"], rel=1e-5)
    assert float(stats["vf_clip_frac"]) == pytest.approx(verl["vf_clip"], rel=1e-6)
    torch.testing.assert_close(kl_k1(logp, ref), torch.tensor(verl["k1"]))


# --- the trainer ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ppo_learns_toy_task(toy, tmp_path):
    model_dir, prompts, target = toy
    cfg = RLConfig(algorithm="ppo", steps=30, batch_prompts=4, group_size=8, lr=3e-3, critic_lr=1e-3, seed=0,
                   checkpoint_every=100)
    final = train_rl(model_dir, None, prompts, rl_toy.make_rollout(target, max_new_tokens=6), cfg, tmp_path)
    log = _log(tmp_path)
    rewards = [r["reward_mean"] for r in log]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"ppo toy reward curve: {' '.join(f'{r:.2f}' for r in rewards)}")
    assert last > 0.5 and last - first > 0.4, rewards
    # The critic learns the returns: its values follow the rising reward.
    values = [r["value_mean"] for r in log]
    assert abs(values[-1] - log[-1]["return_mean"]) < 0.3, (values, [r["return_mean"] for r in log])
    assert all(r["value_loss"] >= 0 and r["critic_grad_norm"] > 0 for r in log)
    # The critic is a training-time model: the final policy directory holds the policy only.
    assert (final / "model.safetensors").is_file() and not (final / ckpt.CRITIC).exists()


def test_kl_in_the_reward_or_as_a_loss(toy, tmp_path):
    model_dir, prompts, _ = toy
    targets = list(range(300, 340))
    logs = {}
    for name, extra in {"reward": {"use_kl_in_reward": True, "kl_estimator": "k1"}, "loss": {}}.items():
        cfg = RLConfig.from_dict({"algorithm": "ppo", "steps": 2, "batch_prompts": 2, "group_size": 4, "lr": 3e-3,
                                  "kl_coef": 0.1, "seed": 0, "checkpoint_every": 10, **extra})
        train_rl(model_dir, None, prompts, rl_toy.make_rollout(targets), cfg, tmp_path / name)
        logs[name] = _log(tmp_path / name)
    first = {name: {k: v for k, v in log[0].items() if not k.endswith("time_s")} for name, log in logs.items()}
    # Step 1: the policy is the reference, so both KL estimates are 0 and the two runs agree exactly.
    assert first["reward"]["kl"] == first["loss"]["kl"] == 0.0
    assert first["reward"] == first["loss"]
    # Step 2: the policy has moved; k1 in the reward and k3 in the loss now give different updates.
    assert logs["reward"][1]["kl"] != logs["loss"][1]["kl"] and logs["loss"][1]["kl"] > 0
    assert logs["reward"][1]["loss"] != logs["loss"][1]["loss"]


# --- a killed ppo run resumes policy and critic exactly -------------------------------------------

PPO_RESUME_CFG = {
    "algorithm": "ppo", "steps": 4, "checkpoint_every": 2, "keep_checkpoints": 2, "batch_prompts": 2,
    "group_size": 4, "lr": 3e-3, "critic_lr": 1e-3, "seed": 1, "kl_coef": 0.05, "use_kl_in_reward": True,
    "kl_estimator": "k1", "num_mini_batches": 2, "micro_batch_size": 2, "ppo_epochs": 2, "warmup_steps": 3,
    "critic_warmup_steps": 2, "gamma": 0.99, "lam": 0.95,
}
# About a third of the samples score, so every step moves both models and their Adam moments matter.
MANY_TARGETS = ",".join(str(t) for t in range(300, 340))


def _env() -> dict[str, str]:
    paths = [str(REPO / "src"), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(p for p in paths if p))


@pytest.mark.slow
def test_killed_ppo_run_resumes_policy_and_critic_exactly(toy, tmp_path):
    model_dir, _, _ = toy
    out = tmp_path / "run"
    args = ["--model", str(model_dir), "--out", str(out), "--target", MANY_TARGETS,
            "--config", json.dumps(PPO_RESUME_CFG)]
    # The rollout blocks at step 4, so the kill lands after the step-2 checkpoint and step 3's log line.
    proc = subprocess.Popen([sys.executable, str(TOY_SCRIPT), *args, "--block-at-step", "4"],
                            env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        import time

        deadline = time.monotonic() + 180
        while not ((out / "checkpoints/step-2" / ckpt.TRAINER_STATE).exists() and (out / LOG_NAME).exists()
                   and len((out / LOG_NAME).read_text().splitlines()) >= 3):
            if proc.poll() is not None:
                raise AssertionError(f"trainer exited early:\n{proc.stderr.read()}")
            assert time.monotonic() < deadline, "timed out waiting for the trainer"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [2]
    critic_dir = out / "checkpoints/step-2" / ckpt.CRITIC
    assert {"model.safetensors", "config.json", "optimizer.pt", "scheduler.json"} <= {p.name for p in critic_dir.iterdir()}

    resumed = subprocess.run([sys.executable, str(TOY_SCRIPT), *args], env=_env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "at step 2" in resumed.stderr

    reference = tmp_path / "reference"
    rl_toy.main(["--model", str(model_dir), "--out", str(reference), "--target", MANY_TARGETS,
                 "--config", json.dumps(PPO_RESUME_CFG)])
    got_log, want_log = _log(out), _log(reference)
    assert [r["step"] for r in got_log] == [1, 2, 3, 4]
    assert all(r["grad_norm"] > 0 and r["critic_grad_norm"] > 0 for r in want_log)
    for got, want in zip(got_log, want_log):
        for key in ("reward_mean", "loss", "kl", "lr", "grad_norm", "value_loss", "value_mean", "critic_lr",
                    "critic_grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (got["step"], key)
    # Identical weights: the policy's final model, and the critic of the last checkpoint.
    for got_file, want_file in [(out / "final/model.safetensors", reference / "final/model.safetensors"),
                                (out / "checkpoints/step-4/critic/model.safetensors",
                                 reference / "checkpoints/step-4/critic/model.safetensors")]:
        got_w, want_w = load_file(got_file), load_file(want_file)
        assert set(got_w) == set(want_w)
        for k in want_w:
            torch.testing.assert_close(got_w[k], want_w[k], rtol=1e-5, atol=1e-6)
