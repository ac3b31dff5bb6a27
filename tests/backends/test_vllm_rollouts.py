"""RL rollouts through a REAL vLLM server whose weights follow the trainer (ragrl.agent.vllm_sync).

One server per module (a CPU start is one to three minutes on 2 shared cores), started by the code
the RL job uses (`rollout_engine`, `rollout_generators`) from the vLLM virtualenv (RAGRL_VLLM_VENV, as in
tests/backends/test_vllm_backend.py; skipped when it does not exist). What is shown:
- after each update the server's log-probs of the step's rollouts equal the trainer's (its own
  scoring, ragrl.train.rl.score), and the server before the sync gave the old policy's, which are
  far off: the sync is what makes them equal;
- the rollouts are multi-turn with observations (loss mask 0) from a search environment;
- a few RL steps train through it (train_log, the weights moved);
- after a reload the prefix cache must be reset: without it the server reuses KV of the old weights.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
import transformers

from ragrl.agent.environments import SearchEnvironment
from ragrl.agent.vllm_sync import RELOAD_METHOD, SERVED_NAME, VLLMPolicyServer, write_weights
from ragrl.recipe import parse_recipe
from ragrl.stages.agent_rl import group_rollouts, rollout_engine, rollout_generators
from ragrl.train.rl import RLConfig, Sample, collate, score, train_rl
from rl_toy import one_torch_thread
from helpers import FakeRetriever, FirstTurnSearches, world_and_model

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("RAGRL_VLLM_VENV", REPO / ".venv-vllm"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
MAX_MODEL_LEN = 2048
# fp32 on both sides; vLLM's CPU kernels sum in another order than torch's.
ATOL = 2e-4

# slow: a vLLM server from .venv-vllm; `make test`'s second stage, which sets RAGRL_VLLM_VENV.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not VLLM_PYTHON.exists(),
    reason=f"no vLLM virtualenv at {VLLM_VENV}; create it with `scripts/vllm_venv.sh` (about 3 min, 3.4 GB)",
)]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_rl")
    world, model_dir = world_and_model(root)
    serve = {
        # float32 like the trainer; eager: no torch.compile warm-up (half the start-up on CPU).
        "args": ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
                 "--disable-uvicorn-access-log"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(root / "vllm-cache"),
                "TOKENIZERS_PARALLELISM": "false"},
        "startup_timeout_s": int(os.environ.get("RAGRL_VLLM_STARTUP_TIMEOUT_S", "600")),
    }
    # Started as the RL job starts it (ragrl.stages.agent_rl.train_agent): the recipe's engine, then
    # the generators for the training, whose server lives in the work dir.
    recipe = parse_recipe({"env": "search", "rl": {"rollout_engine": "vllm",
                                                   "rollout_serve": {**serve, "python": str(VLLM_PYTHON)}}}, "vllm_rl")
    engine = rollout_engine(recipe)
    assert engine == ("vllm", str(VLLM_PYTHON))
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    t0 = time.monotonic()
    with one_torch_thread(), rollout_generators(recipe, tok, model_dir, root / "work", engine) as generators:
        server = generators.__self__
        assert isinstance(server, VLLMPolicyServer) and server.weights_dir == root / "work/rollout_server/weights"
        print(f"\nvLLM policy server {server.url} up after {time.monotonic() - t0:.1f} s", file=sys.stderr)
        rows = [r for r in world.qa["train"] if r["golden_answers"]]
        yield SimpleNamespace(server=server, url=server.url, model_dir=model_dir, tok=tok, world=world, rows=rows,
                              root=root)


def _fresh(policy) -> VLLMPolicyServer:
    """The module's server back on the initial weights, behind a new handle (whose first step-1
    call skips the sync, as a fresh training's would): tests may run in any order."""
    initial = transformers.AutoModelForCausalLM.from_pretrained(policy.model_dir, dtype=torch.float32)
    policy.server.sync(initial)
    return VLLMPolicyServer(policy.url, policy.server.weights_dir)


def _served_logprobs(url: str, samples: list[Sample]) -> list[torch.Tensor]:
    """The server's log-probs of each sample's response tokens given what precedes them."""
    out = []
    with httpx.Client(timeout=300) as client:
        for s in samples:
            ids = list(s.prompt_ids) + list(s.response_ids)
            r = client.post(f"{url}/v1/completions", json={
                "model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0})
            assert r.status_code == 200, r.text[:500]
            entries = r.json()["choices"][0]["prompt_logprobs"]
            out.append(torch.tensor([entries[i][str(ids[i])]["logprob"] for i in range(len(s.prompt_ids), len(ids))]))
    return out


def _trainer_logprobs(model, samples: list[Sample], pad_id: int) -> list[torch.Tensor]:
    """The trainer's own scoring of the samples (what its ratio and loss start from)."""
    logp, _ = score(model, collate(samples, pad_id), [torch.arange(len(samples))], 1.0, "cpu", False, nullcontext)
    return [logp[i, : len(s.response_ids)] for i, s in enumerate(samples)]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def test_rl_steps_through_vllm_follow_the_trainers_weights(policy, tmp_path):
    server = _fresh(policy)
    recipe = parse_recipe({"env": "search", "topk": 2, "rollout": {
        "max_turns": 2, "max_turn_tokens": 24, "max_response_tokens": 400, "max_obs_tokens": 200,
        "temperature": 1.0}}, "vllm_rl")
    env = SearchEnvironment(FakeRetriever(policy.world.passages), topk=2)
    pad_id = policy.tok.pad_token_id
    # A random policy never writes a well-formed search: its first turn is scripted (a search), so
    # every trajectory holds an observation and the server writes the turns after it.
    generators = lambda model, step: FirstTurnSearches(policy.tok, server.generator_for(model, step))  # noqa: E731
    seen: dict[int, dict] = {}

    def rollout_fn(batch_prompts, group_size, model, step):
        previous = seen.get(step - 1)
        before = _served_logprobs(policy.url, previous["samples"]) if previous else None
        samples = []
        for t in group_rollouts(recipe, policy.tok, env, batch_prompts, group_size, model, step, generators):
            # A reward that differs within a group (the samples' lengths mostly do not: a random
            # policy rarely stops before the turn budget), so that every step updates the policy.
            sampled = [i for i, m in zip(t.response_ids, t.loss_mask) if m]
            samples.append(Sample(prompt_ids=list(t.prompt_ids), response_ids=list(t.response_ids),
                                  loss_mask=list(t.loss_mask), turn_index=list(t.turn_index),
                                  reward=sum(sampled) % 97 / 97, group=t.prompt_index))
        seen[step] = {
            "samples": samples, "served": _served_logprobs(policy.url, samples),
            "trainer": _trainer_logprobs(model, samples, pad_id),
            # The previous step's rollouts, scored by the server before and after this step's sync
            # and by the trainer now.
            "previous_before_sync": before,
            "previous_after_sync": _served_logprobs(policy.url, previous["samples"]) if previous else None,
            "previous_trainer_now": _trainer_logprobs(model, previous["samples"], pad_id) if previous else None,
        }
        return samples

    cfg = RLConfig(group_size=3, batch_prompts=2, steps=3, lr=3e-3, checkpoint_every=100, log_entropy=False)
    initial = {k: v.clone() for k, v in transformers.AutoModelForCausalLM.from_pretrained(
        policy.model_dir, dtype=torch.float32).state_dict().items()}
    final = train_rl(policy.model_dir, None, policy.rows[:8], rollout_fn, cfg, tmp_path / "rl")

    # Synced before steps 2 and 3 (step 1 of a fresh run: the server already has those weights).
    assert server.syncs == 2
    for step in (1, 2, 3):
        rec = seen[step]
        assert _max_diff(rec["served"], rec["trainer"]) < ATOL, (step, _max_diff(rec["served"], rec["trainer"]))
        # Multi-turn: an observation (loss mask 0) between generated turns, in every trajectory.
        for s in rec["samples"]:
            mask = s.loss_mask
            assert mask[0] == 1 and any(a == 0 and b == 1 for a, b in zip(mask, mask[1:])), mask
    for step in (2, 3):
        rec = seen[step]
        # Before the sync the server still had the previous weights: its log-probs were those the
        # trainer computed at the previous step, and far from the trainer's now (an update moved
        # them): a server that missed the sync fails the check above by orders of magnitude.
        assert _max_diff(rec["previous_before_sync"], seen[step - 1]["trainer"]) < ATOL
        moved = _max_diff(rec["previous_before_sync"], rec["previous_trainer_now"])
        assert moved > 50 * ATOL, moved
        assert _max_diff(rec["previous_after_sync"], rec["previous_trainer_now"]) < ATOL

    log = [json.loads(line) for line in (tmp_path / "rl" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    assert all(r["tied_group_share"] == 0 for r in log), log
    trained = transformers.AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).state_dict()
    assert max(float((trained[k] - initial[k]).abs().max()) for k in initial) > 1e-3
    server.close()


def test_prefix_cache_must_be_reset_after_a_reload(policy, tmp_path):
    """Why the sync resets the prefix cache: a reloaded server reuses the KV it cached for a prompt
    under the old weights until the cache is reset."""
    _fresh(policy)
    prompt = [5 + (i * 7) % 500 for i in range(700)]  # many KV blocks, whatever the block size

    def greedy() -> tuple[list[int], list[float]]:
        r = httpx.post(f"{policy.url}/v1/completions", timeout=300, json={
            "model": SERVED_NAME, "prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 0,
            "return_token_ids": True})
        choice = r.json()["choices"][0]
        return choice["token_ids"], choice["logprobs"]["token_logprobs"]

    old = greedy()  # fills the cache with the initial weights' KV of the prompt
    model = transformers.AutoModelForCausalLM.from_pretrained(policy.model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.model.layers.parameters():  # not the embedding: only the cached KV can be stale
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    weights = tmp_path / "weights"
    write_weights(model, weights)
    r = httpx.post(f"{policy.url}/collective_rpc", timeout=300,
                   json={"method": RELOAD_METHOD, "kwargs": {"weights_path": str(weights)}})
    assert r.status_code == 200, r.text
    stale = greedy()
    assert httpx.post(f"{policy.url}/reset_prefix_cache", timeout=60).json() == {"success": True}
    fresh = greedy()
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1], -1)
    assert fresh[0][0] == int(expected.argmax())
    assert fresh[1][0] == pytest.approx(float(expected.max()), abs=ATOL)
    # The first new token of the stale answer came from the old KV (its position's own KV is new).
    assert stale[1][0] != pytest.approx(fresh[1][0], abs=1e-3), (old, stale, fresh)
