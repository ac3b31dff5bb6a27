"""The RL trainer end to end on a tiny model: it learns, it resumes after SIGKILL, it runs under
2-process DeepSpeed ZeRO-2 on CPU. The toy task and runnable script live in tests/rl_toy.py."""

from __future__ import annotations

import json
import math
import os

# Before transformers is imported: nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rl_toy
from ragrl import hostinfo
from ragrl.train import checkpoint as ckpt
from ragrl.train.rl import (LOG_NAME, RLConfig, Sample, collate, prompt_indices, sample_advantages, tied_samples,
                            train_rl)

REPO = Path(__file__).resolve().parents[2]
TOY_SCRIPT = REPO / "tests" / "rl_toy.py"
LOG_FIELDS = {
    "step", "reward_mean", "reward_std", "kl", "entropy", "masked_share", "response_length",
    "searches_per_trajectory", "lr", "step_time_s", "loss", "grad_norm",
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with rl_toy.one_torch_thread():
        yield


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    model_dir = rl_toy.build_model(tmp_path_factory.mktemp("rl") / "tiny")
    prompts = rl_toy.make_prompts(model_dir)
    probs = rl_toy.initial_token_probs(model_dir, prompts)
    # The likeliest next token: ~0.3% per position (uniform is 0.22%), ~2% per 6-token completion.
    target = int(probs.argmax())
    return model_dir, prompts, target


def _log(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / LOG_NAME).read_text().splitlines()]


def _env(**extra) -> dict[str, str]:
    paths = [str(REPO / "src"), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(p for p in paths if p))
    env.update(extra)
    return env


# --- pure helpers ------------------------------------------------------------------------------


def test_prompt_order_is_a_pure_function_of_seed_and_step():
    first = [prompt_indices(10, 4, s, seed=3) for s in range(1, 6)]
    assert first == [prompt_indices(10, 4, s, seed=3) for s in range(1, 6)]
    flat = [i for batch in first for i in batch]
    assert sorted(flat[:10]) == list(range(10))  # the first epoch is a permutation
    assert sorted(flat[10:20]) == list(range(10))
    assert flat[:10] != flat[10:20]  # and each epoch is shuffled anew
    assert first != [prompt_indices(10, 4, s, seed=4) for s in range(1, 6)]


def test_collate_left_pads_prompts_and_right_pads_responses():
    samples = [
        Sample([5, 6, 7], [8, 9, 10], [1, 0, 1], [0, 0, 1], 1.0, 0),
        Sample([5], [11], [1], [0], 0.0, 0),
    ]
    b = collate(samples, pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10], [0, 0, 5, 11, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]]
    assert b["position_ids"][1, 2:4].tolist() == [0, 1]
    assert b["response_ids"].tolist() == [[8, 9, 10], [11, 0, 0]]
    assert b["loss_mask"].tolist() == [[1, 0, 1], [1, 0, 0]]
    assert b["turn_index"].tolist() == [[0, 0, 1], [0, 0, 0]]


def test_config_rejects_unknown_values():
    with pytest.raises(ValueError):
        RLConfig(loss_agg="sum")
    with pytest.raises(ValueError):
        RLConfig.from_dict({"stepz": 3})


# --- it learns ---------------------------------------------------------------------------------


def test_grpo_learns_toy_task(toy, tmp_path, capsys):
    model_dir, prompts, target = toy
    cfg = RLConfig(steps=30, batch_prompts=4, group_size=8, lr=3e-3, seed=0, checkpoint_every=100)
    final = train_rl(model_dir, None, prompts, rl_toy.make_rollout(target, max_new_tokens=6), cfg, tmp_path)

    log = _log(tmp_path)
    assert [r["step"] for r in log] == list(range(1, 31))
    assert LOG_FIELDS <= set(log[0])
    rewards = [r["reward_mean"] for r in log]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"toy reward curve: {' '.join(f'{r:.2f}' for r in rewards)}")
    assert last > 0.5 and last - first > 0.4, rewards
    assert all(r["masked_share"] == 0.0 and r["samples"] == 32 for r in log)
    assert "[rl] step 30/30" in capsys.readouterr().err

    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    before = load_file(model_dir / "model.safetensors")
    after = load_file(final / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_remax_learns_toy_task(toy, tmp_path):
    import dataclasses

    model_dir, prompts, target = toy
    sampled = rl_toy.make_rollout(target, max_new_tokens=6)

    def with_greedy(batch, n, model, step):
        # The baseline a remax rollout function supplies: each prompt's greedy completion's reward.
        greedy = []
        for p in batch:
            out = model.generate(input_ids=torch.tensor([p["prompt_ids"]]), do_sample=False, max_new_tokens=6,
                                 pad_token_id=model.generation_config.pad_token_id)
            greedy.append(float(target in out[0, len(p["prompt_ids"]):].tolist()))
        return [dataclasses.replace(s, baseline=greedy[s.group]) for s in sampled(batch, n, model, step)]

    cfg = RLConfig(algorithm="remax", steps=30, batch_prompts=4, group_size=8, lr=3e-3, seed=0, checkpoint_every=100)
    train_rl(model_dir, None, prompts, with_greedy, cfg, tmp_path)
    rewards = [r["reward_mean"] for r in _log(tmp_path)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"remax toy reward curve: {' '.join(f'{r:.2f}' for r in rewards)}")
    assert last > 0.5 and last - first > 0.4, rewards


def test_remax_token_advantages_are_the_margin_over_greedy_and_the_turn_term_adds_as_under_grpo():
    # Two prompts, two samples each; the second turn of each response follows an observation token.
    def sample(reward, group, baseline, turns):
        return Sample(prompt_ids=[5], response_ids=[7, 8, 9], loss_mask=[1, 0, 1], turn_index=[0, 0, 1],
                      reward=reward, group=group, baseline=baseline, turn_rewards=turns)

    samples = [sample(1.0, 0, 1.0, [0.2, 0.0]), sample(0.0, 0, 1.0, [0.0, 0.0]),
               sample(0.0, 1, 0.0, [0.0, 0.1]), sample(1.0, 1, 0.0, [0.0, 0.0])]
    batch = collate(samples, pad_id=0)
    remax = sample_advantages(samples, batch, RLConfig(algorithm="remax"))
    # r - b on the policy's tokens, 0 on the observation; no group mean, no std division
    assert remax.tolist() == [[0.0, 0.0, 0.0], [-1.0, 0.0, -1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]
    assert sample_advantages(samples, batch, RLConfig(algorithm="grpo"))[0, 0] > 0.5  # grpo: above its group
    # The per-turn term (KG-R1) is the same group-relative one grpo adds, on top of the margin.
    weight = 0.5
    turns = sample_advantages(samples, batch, RLConfig(algorithm="remax", turn_advantage_weight=weight))
    grpo_turns = (sample_advantages(samples, batch, RLConfig(algorithm="grpo", turn_advantage_weight=weight))
                  - sample_advantages(samples, batch, RLConfig(algorithm="grpo")))
    assert torch.allclose(turns - remax, grpo_turns)
    assert (turns - remax).abs().sum() > 0


def test_tied_samples_marks_groups_whose_rewards_all_tie():
    assert tied_samples([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], [0, 0, 1, 1, 2, 2]) == [True, True, False, False, True, True]
    # With turn rewards, a group tied on its global reward still learns from turns that differ
    # (a search that found the second hop against one that did not); equal turns leave it tied.
    turns = [[0.5, 0.5], [0.5, 0.0], [1.0], [1.0, 0.0], [0.5], [0.5]]
    assert tied_samples([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], [0, 0, 1, 1, 2, 2], turns) == [
        False, False, False, False, True, True]
    assert tied_samples([0.0, 0.0], [0, 0], [None, None]) == [True, True]
    # remax: the greedy reward is one more member of the group; all fail where greedy succeeded
    # is a signal (group 0), all succeed as greedy did is not (group 1).
    assert tied_samples([0.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], None, [1.0, 1.0, 1.0, 1.0]) == [False, False, True, True]


def test_tied_group_share_is_logged_and_the_filter_skips_all_tied_steps(toy, tmp_path):
    import dataclasses

    model_dir, prompts, target = toy
    inner = rl_toy.make_rollout(target, max_new_tokens=4)

    def constant(batch, n, model, step):  # every group ties: zero advantage everywhere
        return [dataclasses.replace(s, reward=1.0) for s in inner(batch, n, model, step)]

    for flag in (False, True):
        out = tmp_path / str(flag)
        cfg = RLConfig(steps=2, batch_prompts=2, group_size=2, lr=3e-3, seed=0, checkpoint_every=100,
                       filter_tied_groups=flag)
        train_rl(model_dir, None, prompts, constant, cfg, out)
        log = _log(out)
        assert [r["tied_group_share"] for r in log] == [1.0, 1.0]
        # Filtered: no update at all (no gradient norm); unfiltered: an update with zero advantages.
        assert all((r["grad_norm"] is None) == flag for r in log)


@pytest.mark.parametrize(("padding_free", "chunk"), [(False, 1024), (True, 1024), (False, 0)],
                         ids=["padded", "padding-free", "unchunked"])
def test_entropy_bonus_raises_the_policys_entropy(toy, tmp_path, padding_free, chunk):
    # Every group ties (zero advantages): the policy-gradient term is 0, so the update is the bonus
    # alone, and it must raise the entropy of the next-token distribution after the prompts;
    # without the bonus the same update leaves the weights as they were.
    import dataclasses

    model_dir, prompts, target = toy
    inner = rl_toy.make_rollout(target, max_new_tokens=4)

    def constant(batch, n, model, step):
        return [dataclasses.replace(s, reward=1.0) for s in inner(batch, n, model, step)]

    def entropy(model_path) -> float:
        probs = rl_toy.initial_token_probs(model_path, prompts)
        return float(-(probs * probs.log()).sum())

    start = entropy(model_dir)
    for coeff in (0.0, 1.0):
        out = tmp_path / str(coeff)
        cfg = RLConfig(steps=4, batch_prompts=2, group_size=2, lr=1e-3, seed=0, checkpoint_every=100,
                       entropy_coeff=coeff, padding_free=padding_free, logprob_chunk_tokens=chunk)
        final = train_rl(model_dir, None, prompts, constant, cfg, out)
        if coeff == 0.0:
            before, after = load_file(model_dir / "model.safetensors"), load_file(final / "model.safetensors")
            assert all(torch.equal(before[k], after[k]) for k in before)
        else:
            assert entropy(final) > start + 1e-3


def test_cosine_lr_schedule_is_transformers_after_the_warm_up(toy, tmp_path):
    # KnowRL's TRL run: cosine after a warm-up. Each logged step's LR against transformers' own
    # schedule (ours warms up to 1 at step warmup - 1, theirs at step warmup: their first LR is 0).
    import dataclasses

    from transformers import get_cosine_schedule_with_warmup

    model_dir, prompts, target = toy
    cfg = RLConfig(steps=6, batch_prompts=2, group_size=2, lr=1e-3, warmup_steps=2, lr_scheduler="cosine",
                   seed=0, checkpoint_every=100)
    train_rl(model_dir, None, prompts, rl_toy.make_rollout(target, max_new_tokens=2), cfg, tmp_path)
    lrs = [r["lr"] for r in _log(tmp_path)]
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    theirs = get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=6)
    want = []
    for _ in range(6):
        want.append(opt.param_groups[0]["lr"])
        opt.step()
        theirs.step()
    assert lrs[:2] == pytest.approx([5e-4, 1e-3]) and want[:2] == pytest.approx([0.0, 5e-4])
    assert lrs[2:] == pytest.approx(want[2:])
    assert lrs[2] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(0.75 * math.pi)))
    # A finished run extended (steps 3 -> 6) takes the new schedule's LR from its first new step on:
    # the LR it saved at its last step (0 under a 3-step cosine) is not the next step's.
    ext = tmp_path / "extended"
    for steps in (3, 6):
        train_rl(model_dir, None, prompts, rl_toy.make_rollout(target, max_new_tokens=2),
                 dataclasses.replace(cfg, steps=steps), ext)
    assert [r["lr"] for r in _log(ext)][3:] == pytest.approx(lrs[3:])
    # constant (the default) stays at lr after the warm-up
    const = tmp_path / "constant"
    train_rl(model_dir, None, prompts, rl_toy.make_rollout(target, max_new_tokens=2),
             RLConfig(steps=3, batch_prompts=2, group_size=2, lr=1e-3, warmup_steps=2, seed=0, checkpoint_every=100),
             const)
    assert [r["lr"] for r in _log(const)] == pytest.approx([5e-4, 1e-3, 1e-3])


@pytest.mark.parametrize("loss_agg", ["token-mean", "grpo", "dr_grpo"])
def test_micro_batching_does_not_change_the_update(toy, tmp_path, loss_agg):
    # Gradient accumulation must reproduce the whole-mini-batch loss exactly: micro losses share
    # the mini-batch denominator and undo accelerate's division by the accumulation steps.
    model_dir, prompts, _ = toy
    targets = list(range(300, 340))
    logs = []
    for micro in (None, 3):  # 8 samples -> micro-batches of 3, 3, 2
        cfg = RLConfig(steps=2, batch_prompts=2, group_size=4, lr=1e-3, kl_coef=0.1, ppo_epochs=2, seed=0,
                       loss_agg=loss_agg, micro_batch_size=micro, checkpoint_every=10)
        train_rl(model_dir, None, prompts, rl_toy.make_rollout(targets), cfg, tmp_path / str(micro))
        logs.append(_log(tmp_path / str(micro)))
    assert logs[0][0]["grad_norm"] > 0
    for whole, split in zip(*logs):
        for key in ("loss", "grad_norm", "kl", "reward_mean"):
            assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key


# --- resume after SIGKILL ----------------------------------------------------------------------

RESUME_CFG = {
    "steps": 8, "checkpoint_every": 2, "keep_checkpoints": 2, "batch_prompts": 2, "group_size": 4,
    "lr": 3e-3, "seed": 1, "kl_coef": 0.05, "num_mini_batches": 2, "micro_batch_size": 2, "ppo_epochs": 2,
    "warmup_steps": 3, "loss_agg": "grpo",
}


def _wait_for(predicate, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early:\n{proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the trainer")
        time.sleep(0.05)


# 40 target tokens: about a third of the samples score, so every step updates the weights and
# the Adam moments matter (with all-zero rewards, a resume that lost them would still match).
MANY_TARGETS = ",".join(str(t) for t in range(300, 340))


def test_two_uninterrupted_runs_give_identical_weights(toy, tmp_path):
    """Issue #34 F3's audit: rollouts, mini-batch order and dropout come from cfg.seed, not from the
    caller's global RNG (left in a different state before each run, as two processes would)."""
    model_dir, prompts, _ = toy
    cfg = RLConfig.from_dict({**RESUME_CFG, "steps": 3, "checkpoint_every": 100})
    finals = []
    for k in range(2):
        torch.manual_seed(100 + k)
        final = train_rl(model_dir, None, prompts, rl_toy.make_rollout([int(t) for t in MANY_TARGETS.split(",")]),
                         cfg, tmp_path / f"run{k}")
        finals.append((final / "model.safetensors").read_bytes())
    assert finals[0] == finals[1]
    logs = [[{k: v for k, v in r.items() if not k.endswith("time_s")} for r in _log(tmp_path / f"run{k}")]
            for k in range(2)]
    assert logs[0] == logs[1] and len(logs[0]) == 3


@pytest.mark.slow
def test_resume_after_sigkill_continues_exactly(toy, tmp_path):
    model_dir, _, _ = toy
    out = tmp_path / "run"
    args = ["--model", str(model_dir), "--out", str(out), "--target", MANY_TARGETS, "--config", json.dumps(RESUME_CFG)]
    # The rollout blocks at step 6, so the kill lands after the step-4 checkpoint and the step-5 log line.
    proc = subprocess.Popen(
        [sys.executable, str(TOY_SCRIPT), *args, "--block-at-step", "6"],
        env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )
    try:
        log_file = out / LOG_NAME
        _wait_for(
            lambda: (out / "checkpoints" / "step-4" / ckpt.TRAINER_STATE).exists()
            and log_file.exists() and len(log_file.read_text().splitlines()) >= 5,
            proc,
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_log = _log(out)
    assert [r["step"] for r in killed_log] == [1, 2, 3, 4, 5]
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [2, 4]
    assert not (out / ckpt.FINAL).exists()
    assert ckpt.read_trainer_state(out / "checkpoints" / "step-4")["step"] == 4

    resumed = subprocess.run(
        [sys.executable, str(TOY_SCRIPT), *args], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr and "at step 4" in resumed.stderr
    assert "[rl] step 4/8" not in resumed.stderr and "[rl] step 5/8" in resumed.stderr
    log = _log(out)
    assert [r["step"] for r in log] == list(range(1, 9))
    assert log[:4] == killed_log[:4]  # lines up to the checkpoint kept verbatim
    assert ckpt.read_trainer_state(out / "checkpoints" / "step-8")["step"] == 8
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [6, 8]
    final = out / ckpt.FINAL
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    assert json.loads((final / ckpt.TRAINER_STATE).read_text())["finished"] is True
    # The model names both starts of its training and the host of each.
    record = hostinfo.read_record(final)
    assert record["stage"] == "rl" and record["start"] is None  # the toy start has no record
    assert [(s["from_step"], s["cpu"]) for s in record["segments"]] == [(0, hostinfo.cpu_model()),
                                                                        (4, hostinfo.cpu_model())]

    # Data order, RNG, optimizer (Adam moments) and warm-up schedule all continue: the resumed run
    # reproduces an uninterrupted one.
    reference = tmp_path / "reference"
    rl_toy.main(["--model", str(model_dir), "--out", str(reference), "--target", MANY_TARGETS,
                 "--config", json.dumps(RESUME_CFG)])
    ref_log = _log(reference)
    assert all(r["grad_norm"] > 0 for r in ref_log)
    for got, want in zip(log, ref_log):
        for key in ("reward_mean", "loss", "kl", "entropy", "lr", "grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (got["step"], key)
    assert killed_log[4]["reward_mean"] == log[4]["reward_mean"]
    got_w, want_w = load_file(final / "model.safetensors"), load_file(reference / "final" / "model.safetensors")
    for k in want_w:
        torch.testing.assert_close(got_w[k], want_w[k], rtol=1e-5, atol=1e-6)

    # A re-run of a finished training is a no-op.
    log_bytes = (out / LOG_NAME).read_bytes()
    final_mtime = (final / "model.safetensors").stat().st_mtime_ns
    t0 = time.monotonic()
    again = train_rl(model_dir, None, [], rl_toy.make_rollout(300), RLConfig.from_dict(RESUME_CFG), out)
    assert again == final
    assert time.monotonic() - t0 < 1.0
    assert (out / LOG_NAME).read_bytes() == log_bytes
    assert (final / "model.safetensors").stat().st_mtime_ns == final_mtime
    assert len(hostinfo.read_segments(out)) == 2  # and adds no start to the record


# --- DeepSpeed ZeRO-2, 2 processes on CPU -------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(model_dir, out, targets, cfg) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", "src/ragrl/train/deepspeed/accelerate_zero2_cpu.yaml",
        # A free port: other test runs on this machine may hold accelerate's default 29500.
        "--main_process_port", str(_free_port()),
        str(TOY_SCRIPT), "--model", str(model_dir), "--out", str(out), "--target", targets, "--config", json.dumps(cfg),
    ]
    # DS_ACCELERATOR=cpu: use DeepSpeed's CPU accelerator without probing for GPUs. The gloo
    # backend is chosen by ragrl.train.rl itself; OMP_NUM_THREADS=1 keeps 2 ranks off each other's cores.
    env = _env(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
def test_deepspeed_zero2_two_cpu_processes(toy, tmp_path):
    model_dir, _, _ = toy
    out = tmp_path / "ds"
    targets = MANY_TARGETS
    cfg = {"steps": 3, "batch_prompts": 4, "group_size": 4, "lr": 3e-3, "checkpoint_every": 2, "seed": 0}
    run = _launch(model_dir, out, targets, cfg)
    assert run.returncode == 0, run.stderr[-4000:]
    log = _log(out)
    assert [r["step"] for r in log] == [1, 2, 3]
    # Each rank rolled out 2 of the 4 prompts; the logged statistics pool both ranks.
    assert all(r["samples"] == 16 for r in log)
    assert any(r["grad_norm"] for r in log)
    step2 = out / "checkpoints" / "step-2"
    assert {p.name for p in step2.glob("optimizer-rank*.pt")} == {"optimizer-rank0.pt", "optimizer-rank1.pt"}
    assert (out / "final" / "model.safetensors").is_file()

    # Extending the finished run resumes the ZeRO partitions from the step-3 checkpoint.
    run = _launch(model_dir, out, targets, {**cfg, "steps": 4})
    assert run.returncode == 0, run.stderr[-4000:]
    assert "at step 3" in run.stderr
    assert [r["step"] for r in _log(out)] == [1, 2, 3, 4]
    assert json.loads((out / "final" / ckpt.TRAINER_STATE).read_text())["step"] == 4


@pytest.mark.slow
def test_deepspeed_zero2_padding_free_logs_what_padded_batches_log(toy, tmp_path):
    # rl.padding_free under the engine's wrapper: the packed row's boundaries reach the attention
    # through DeepSpeed's forward on both ranks, and the update is the padded one's.
    model_dir, _, _ = toy
    cfg = {"steps": 2, "batch_prompts": 4, "group_size": 4, "lr": 3e-3, "kl_coef": 0.05, "checkpoint_every": 2,
           "seed": 0}
    logs = {}
    for padding_free in (False, True):
        out = tmp_path / f"ds-{padding_free}"
        run = _launch(model_dir, out, MANY_TARGETS, {**cfg, "padding_free": padding_free})
        assert run.returncode == 0, run.stderr[-4000:]
        assert ("rl.padding_free: each micro-batch goes in as one unpadded row" in run.stderr) == padding_free
        logs[padding_free] = _log(out)
    for want, got in zip(logs[False], logs[True], strict=True):
        assert want["response_length"] == got["response_length"] and want["reward_mean"] == got["reward_mean"]
        for key in ("loss", "kl", "grad_norm", "entropy"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (want["step"], key)
    assert logs[False][0]["grad_norm"] > 1e-3 and logs[False][1]["kl"] > 1e-5  # real updates were compared
