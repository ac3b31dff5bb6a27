"""How the local RL trainer's rollouts are generated, without a vLLM server: one RL step's HF
rollouts go out as one batched `generate` per turn, and `rl.rollout_engine` picks the engine
(hf by default; auto falls back to hf with a notice; an explicit vllm without vLLM fails before
the work dir is touched). The vLLM engine itself: tests/backends/test_vllm_rollouts.py."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import ast
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from ragrl.agent.environments import SearchEnvironment
from ragrl.agent.generation import CountingGenerator
from ragrl.agent.vllm_sync import WEIGHTS_FILE, RolloutEngineUnavailable, write_weights
from ragrl.recipe import parse_recipe
from ragrl.serving import PYTHON_ENV, ServerStartError
from ragrl.stages.agent_rl import hf_generators, make_rollout_fn, rollout_engine
from ragrl.train.rl import RLConfig, train_rl
from rl_toy import one_torch_thread
from helpers import FakeRetriever, FirstTurnSearches, encode_text, world_and_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl_engine")
    world, model_dir = world_and_model(root)
    with one_torch_thread():
        yield dataclasses.make_dataclass("Tiny", ["world", "model_dir", "tok", "root"])(
            world, model_dir, transformers.AutoTokenizer.from_pretrained(model_dir), root)


@pytest.mark.slow
def test_one_rl_steps_hf_rollouts_go_out_as_one_batch_per_turn(tiny, tmp_path):
    max_turns, group, prompts = 2, 3, 4
    recipe = parse_recipe({"env": "search", "topk": 2, "rollout": {
        "max_turns": max_turns, "max_turn_tokens": 24, "max_response_tokens": 400, "max_obs_tokens": 200}}, "batched")
    sizes: list[int] = []

    def record(counts):
        sizes.append(counts["sequences"] - sum(sizes))

    hf = hf_generators(tiny.tok)
    # The first turn is scripted searches (a random policy writes none), so the step has turns
    # after an observation; every call, scripted or not, goes through the counter.
    generators = lambda model, step: CountingGenerator(FirstTurnSearches(tiny.tok, hf(model, step)), record)  # noqa: E731
    env = SearchEnvironment(FakeRetriever(tiny.world.passages), topk=2)
    cfg = RLConfig(group_size=group, batch_prompts=prompts, steps=1, checkpoint_every=100, log_entropy=False)
    train_rl(tiny.model_dir, None, tiny.world.qa["train"][:prompts], make_rollout_fn(recipe, tiny.tok, env, generators),
             cfg, tmp_path / "rl")
    assert [json.loads(line)["step"] for line in (tmp_path / "rl" / "train_log.jsonl").read_text().splitlines()] == [1]
    # One call per turn for every trajectory still running: the first holds every prompt x sample.
    assert sizes[0] == prompts * group
    assert 2 <= len(sizes) <= max_turns + 1, sizes
    assert all(0 < n <= sizes[0] for n in sizes), sizes


def test_rollout_engine_defaults_to_hf_in_process():
    assert rollout_engine(parse_recipe({"env": "search"}, "r")) == ("hf", None)
    assert rollout_engine(parse_recipe({"env": "search", "rl": {"rollout_engine": "hf"}}, "r")) == ("hf", None)


def test_auto_without_vllm_falls_back_to_hf_with_a_notice(monkeypatch, capsys):
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    real = importlib.util.find_spec
    # This environment has no vllm; make sure of it whatever is installed.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert rollout_engine(parse_recipe({"env": "search", "rl": {"rollout_engine": "auto"}}, "r")) == ("hf", None)
    notice = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(notice) == 1 and "recipes.r.rl.rollout_engine auto: no vLLM" in notice[0] and "HF generate" in notice[0]


def test_vllm_found_by_setting_or_environment(monkeypatch, tmp_path, capsys):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    recipe = parse_recipe({"env": "search", "rl": {"rollout_engine": "vllm", "rollout_serve": {"python": str(python)}}},
                          "r")
    assert rollout_engine(recipe) == ("vllm", str(python))
    monkeypatch.setenv(PYTHON_ENV, str(python))
    assert rollout_engine(parse_recipe({"env": "search", "rl": {"rollout_engine": "auto"}}, "r")) == ("vllm", str(python))
    # One server serves one trainer process: a multi-process launch is refused, naming the key
    # (auto: falls back to HF, saying why).
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"recipes\.r\.rl\.rollout_engine.*one trainer process"):
        rollout_engine(recipe)
    capsys.readouterr()
    assert rollout_engine(parse_recipe({"env": "search", "rl": {"rollout_engine": "auto"}}, "r")) == ("hf", None)
    assert "auto: 2 trainer processes" in capsys.readouterr().err


def test_explicit_vllm_without_vllm_fails_before_the_work_dir_is_touched(monkeypatch, tmp_path):
    from ragrl.stages.agent_rl import train_agent

    monkeypatch.delenv(PYTHON_ENV, raising=False)
    missing = tmp_path / "no-venv" / "bin" / "python"
    recipe = parse_recipe({"env": "search", "rl": {"rollout_engine": "vllm", "rollout_serve": {"python": str(missing)}}},
                          "r")
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep").write_text("a previous run's progress")
    with pytest.raises(RolloutEngineUnavailable, match=rf"recipes\.r\.rl\.rollout_engine.*{missing}.*does not exist"):
        train_agent(recipe, tmp_path / "qa.parquet", tmp_path / "policy", work, None)
    assert sorted(p.name for p in work.iterdir()) == ["keep"]


def test_the_rl_job_starts_its_server_only_for_a_training_left_to_run(tiny, tmp_path, monkeypatch):
    from ragrl.stages import agent_rl

    # An "interpreter with vLLM" that exits at once: a server start fails fast, saying so.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    recipe = parse_recipe({"env": "search", "topk": 2, "rollout": {
        "max_turns": 1, "max_turn_tokens": 8, "max_response_tokens": 64, "max_obs_tokens": 32},
        "rl": {"steps": 1, "group_size": 2, "batch_prompts": 2, "checkpoint_every": 1, "rollout_engine": "vllm",
               "rollout_serve": {"python": str(fake), "startup_timeout_s": 60}}}, "served")
    env = SearchEnvironment(FakeRetriever(tiny.world.passages), topk=2)
    qa = tiny.root / "world/qa/train.parquet"
    # Training left to run: the job starts the server (in the work dir) before the first step.
    with pytest.raises(ServerStartError, match="exited with code 3"):
        agent_rl.train_agent(recipe, qa, tiny.model_dir, tmp_path / "work", env, limit=4)
    assert (tmp_path / "work/rollout_server/vllm.log").read_text().startswith(str(fake))
    # The same training finished (here by HF rollouts): re-running the job starts nothing.
    with monkeypatch.context() as m:
        m.setattr(agent_rl, "rollout_engine", lambda recipe: ("hf", None))
        final = agent_rl.train_agent(recipe, qa, tiny.model_dir, tmp_path / "work", env, limit=4)
    (tmp_path / "work/rollout_server/vllm.log").unlink()
    assert agent_rl.train_agent(recipe, qa, tiny.model_dir, tmp_path / "work", env, limit=4) == final
    assert not (tmp_path / "work/rollout_server/vllm.log").exists()


def test_served_weights_hold_a_tied_tensor_once_and_appear_whole(tiny, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32)
    assert model.config.tie_word_embeddings
    path = write_weights(model, tmp_path / "w")
    assert path.name == WEIGHTS_FILE and sorted(p.name for p in path.parent.iterdir()) == [WEIGHTS_FILE]
    saved = load_file(path)
    state = model.state_dict()
    # vLLM skips lm_head.weight of a tied model and loads the embedding: it must be there.
    assert "lm_head.weight" not in saved and set(saved) == set(state) - {"lm_head.weight"}
    assert all(torch.equal(saved[k], state[k]) for k in saved)


def test_the_worker_extension_imports_nothing_from_ragrl():
    # It runs in the vLLM server's interpreter, which has no ragrl.
    tree = ast.parse((REPO / "src/ragrl/agent/vllm_worker_ext.py").read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert modules and not any(m.split(".")[0] == "ragrl" for m in modules), modules


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--hos", "0.0.0.0"], ["--port", "8000"]])
def test_rollout_serve_args_may_not_move_the_server_off_its_loopback_port(args):
    # The server runs with VLLM_SERVER_DEV_MODE, whose /collective_rpc takes no API key: a --host
    # (or a prefix argparse reads as it) later in the command line would expose it.
    with pytest.raises(ValueError, match=r"recipes\.r\.rl\.rollout_serve\.args.*the RL job sets itself"):
        parse_recipe({"env": "search", "rl": {"rollout_engine": "vllm", "rollout_serve": {"args": args}}}, "r")
    allowed = ["--dtype", "float32", "--hf-overrides", "{}", "--max-model-len=64"]
    parse_recipe({"env": "search", "rl": {"rollout_engine": "vllm", "rollout_serve": {"args": allowed}}}, "r")


def test_the_synced_weights_file_is_deleted_with_the_server(tiny, tmp_path, monkeypatch):
    # A whole copy of the policy per RL work dir (fp32: 28 GB for 7B) must not outlive the training,
    # whether it ends or fails.
    from contextlib import contextmanager

    from ragrl.agent import vllm_sync

    @contextmanager
    def no_server(spec):
        yield "http://127.0.0.1:9"

    monkeypatch.setattr(vllm_sync, "model_server", no_server)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32)
    with vllm_sync.vllm_policy_server(tiny.model_dir, tmp_path / "srv", {}, "python") as server:
        written = write_weights(model, server.weights_dir)
        assert written.is_file()
    assert not written.exists() and not server.weights_dir.exists()
    with pytest.raises(RuntimeError, match="training failed"):
        with vllm_sync.vllm_policy_server(tiny.model_dir, tmp_path / "srv", {}, "python") as server:
            written = write_weights(model, server.weights_dir)
            raise RuntimeError("training failed")
    assert not written.exists()
    assert (tmp_path / "srv" / "ext").is_dir()  # the rest of the server dir (its log, the extension) stays


class _GreedyKnows:
    """Greedy decoding answers the first prompt's question right and every other wrong; sampling
    answers every question wrong: what algorithm remax must see per prompt."""

    def __init__(self, tok, first_question: str, answer: str):
        self.tok, self.first_question, self.answer = tok, first_question, answer
        self.greedy_rows = 0

    def generate(self, batch, max_new_tokens, temperature=1.0, *args, **kwargs):
        self.greedy_rows += len(batch) if temperature <= 0 else 0
        out = []
        for ids in batch:
            right = temperature <= 0 and self.first_question in self.tok.decode(ids)
            text = f"<think>so</think><answer>{self.answer if right else 'Nobody'}</answer>"
            out.append(encode_text(self.tok, text))
        return out


def test_remax_samples_carry_their_own_prompts_greedy_reward_and_the_trainer_needs_it(tiny, tmp_path):
    rows = tiny.world.qa["train"][:2]
    spec = {"env": "search", "topk": 2, "reward": {"em": 1.0},
            "rollout": {"max_turns": 1, "max_turn_tokens": 48, "max_response_tokens": 200}}
    recipe = parse_recipe({**spec, "rl": {"algorithm": "remax"}}, "rx")
    env = SearchEnvironment(FakeRetriever(tiny.world.passages), topk=2)
    fake = _GreedyKnows(tiny.tok, rows[0]["question"], rows[0]["golden_answers"][0])
    samples = make_rollout_fn(recipe, tiny.tok, env, lambda model, step: fake)(rows, 3, None, 1)
    assert [s.group for s in samples] == [0, 0, 0, 1, 1, 1]
    # Greedy is right on prompt 0 only; every sample is wrong: the margin is -1 there, 0 on prompt 1.
    assert [s.baseline for s in samples] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert [s.stats["greedy_reward"] for s in samples] == [s.baseline for s in samples]
    assert all(s.reward == 0.0 for s in samples)
    assert fake.greedy_rows == len(rows)  # one greedy rollout per prompt, not per sample
    # Under grpo no greedy rollout runs and no sample carries a baseline.
    fake.greedy_rows = 0
    grpo = make_rollout_fn(parse_recipe(spec, "g"), tiny.tok, env, lambda model, step: fake)(rows, 2, None, 1)
    assert all(s.baseline is None and "greedy_reward" not in s.stats for s in grpo)
    assert fake.greedy_rows == 0

    # A rollout function that gives no baseline cannot train remax: the step names what is missing.
    def no_baseline(batch, n, model, step):
        return [dataclasses.replace(s, baseline=None) for s in samples[: len(batch) * n]]

    cfg = RLConfig(algorithm="remax", group_size=3, batch_prompts=2, steps=1, checkpoint_every=100, log_entropy=False)
    with pytest.raises(ValueError, match="algorithm remax needs its prompt's greedy reward"):
        train_rl(tiny.model_dir, None, rows, no_baseline, cfg, tmp_path / "rl")
