"""HARR's training loop: a run killed mid-way and re-run ends exactly where an uninterrupted run does."""

from __future__ import annotations

import os

# Before transformers is imported: nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json

import faiss
import numpy as np
import pytest
import torch

from ragrl import hostinfo
from ragrl.train.retriever_grpo import Trajectory
from ragrl.train.retriever_policy import retrieve
from ragrl.train.retriever_train import RetrieverTrainConfig, step_questions, train_retriever

from harr_helpers import ToyPolicy, one_thread  # noqa: F401  (one_thread: autouse)

STATES = [f"Query: q{i}" for i in range(5)]
ROWS = [{"id": f"q{i}", "state": s, "target": 3 * i} for i, s in enumerate(STATES)]
CFG = RetrieverTrainConfig(steps=6, questions_per_step=2, group_size=4, lr=0.05, alpha=0.3, checkpoint_every=2,
                           seed=7)


class Killed(RuntimeError):
    pass


def _index():
    docs = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(8)
    index.add(docs)
    return index


def _rollout(policy, index, kill_at: int | None = None):
    def rollout(batch, step):
        if step == kill_at:
            raise Killed(f"preempted at step {step}")
        gen = torch.Generator().manual_seed(1000 + step)  # the sampler is a function of the step
        trajs = []
        for group, row in enumerate(batch):
            for s in retrieve(policy, index, [row["state"]] * CFG.group_size, pool_size=16, k=3, alpha=CFG.alpha,
                              generator=gen):
                trajs.append(Trajectory(row["id"], group, float(row["target"] in s.doc_ids), [s]))
        return trajs
    return rollout


def test_step_questions_cover_every_row_each_epoch():
    seen = [i for step in range(1, 6) for i in step_questions(5, step, 2, seed=3)]  # two epochs
    assert sorted(seen[:5]) == list(range(5)) and sorted(seen[5:10]) == list(range(5))
    assert step_questions(5, 2, 2, 3) == step_questions(5, 2, 2, 3)
    with pytest.raises(ValueError, match="no questions"):
        step_questions(0, 1, 2, 3)


def test_resume_after_a_kill_matches_the_uninterrupted_run(tmp_path):
    index = _index()
    straight = ToyPolicy(STATES, 8, seed=1)
    final = train_retriever(straight, index, ROWS, _rollout(straight, index), tmp_path / "a", CFG)
    assert json.loads((final / "state.json").read_text())["finished"] is True

    killed = ToyPolicy(STATES, 8, seed=1)
    with pytest.raises(Killed):
        train_retriever(killed, index, ROWS, _rollout(killed, index, kill_at=5), tmp_path / "b", CFG)
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["step-2", "step-4"]
    assert not (tmp_path / "b" / "final").exists()
    resumed = ToyPolicy(STATES, 8, seed=99)  # a fresh process: the weights come from the checkpoint
    train_retriever(resumed, index, ROWS, _rollout(resumed, index), tmp_path / "b", CFG)

    assert torch.equal(resumed.table, straight.table)
    log_a = (tmp_path / "a" / "train_log.jsonl").read_text()
    assert (tmp_path / "b" / "train_log.jsonl").read_text() == log_a
    assert [json.loads(line)["step"] for line in log_a.splitlines()] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["step-4", "step-6"]
    # Both starts are on record (the killed one up to its step-4 checkpoint), the straight run's one.
    assert [s["from_step"] for s in hostinfo.read_segments(tmp_path / "b")] == [0, 4]
    assert [s["from_step"] for s in hostinfo.read_segments(tmp_path / "a")] == [0]
    # Finished: a re-run does nothing.
    assert train_retriever(resumed, index, ROWS, _rollout(resumed, index, kill_at=1), tmp_path / "b", CFG) == \
        tmp_path / "b" / "final"
    assert len(hostinfo.read_segments(tmp_path / "b")) == 2


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="group_size=1 must be >= 2"):
        RetrieverTrainConfig(group_size=1)
    with pytest.raises(ValueError, match="steps=0"):
        RetrieverTrainConfig(steps=0)


# --- the real query encoder: LoRA adapters initialised from the training's seed ----------------------

PASSAGES = [f"{n} was born in {c}." for n in ("Orla Venmark", "Teslo Quivar", "Mirel Dostan", "Idra Volkin")
            for c in ("Velmora", "Ostrel", "Quanby", "Dresk")]
REAL_ROWS = [{"id": f"q{i}", "state": f"Where was {p.split(' was')[0]} born?", "target": 4 * i + i % 4}
             for i, p in enumerate(PASSAGES[::4])]
REAL = {"steps": 4, "questions_per_step": 2, "group_size": 4, "lr": 0.01, "alpha": 0.3, "checkpoint_every": 2,
        "seed": 7}


@pytest.fixture(scope="module")
def minilm():
    from ragrl.retrieval.encoder import Encoder

    encoder = Encoder("sentence-transformers/all-MiniLM-L6-v2", batch_size=16)
    docs = encoder.encode_passages(PASSAGES, show_progress=False)
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(docs)
    return encoder.info(), index


def _real_run(minilm, out, process_seed: int, kill_at: int | None = None):
    """HARR's training as `ragrl harr-train` builds it, in a 'process' whose global RNG is `process_seed`."""
    from ragrl.recipe import parse_harr
    from ragrl.stages.harr import _policy

    info, index = minilm
    harr = parse_harr({"generator": "g", "index": "flat", "train_dataset": "t", "eval_datasets": ["t"],
                       "encoder": {"lora": True, "lora_r": 4, "lora_alpha": 8}, "train": REAL})
    torch.manual_seed(process_seed)
    policy = _policy({"encoder": info}, harr, None, trainable=True)
    train_retriever(policy, index, REAL_ROWS, _real_rollout(policy, index, kill_at), out, harr.train)
    return policy


def _real_rollout(policy, index, kill_at):
    def rollout(batch, step):
        if step == kill_at:
            raise Killed(f"preempted at step {step}")
        gen = torch.Generator().manual_seed(1000 + step)
        return [Trajectory(row["id"], group, float(row["target"] in s.doc_ids), [s])
                for group, row in enumerate(batch)
                for s in retrieve(policy, index, [row["state"]] * REAL["group_size"], pool_size=16, k=3,
                                  alpha=REAL["alpha"], generator=gen)]
    return rollout


@pytest.mark.slow
def test_the_real_encoder_trains_reproducibly_and_a_resumed_run_ends_where_an_uninterrupted_one_does(
        minilm, tmp_path):
    """Issue #34 F3: get_peft_model drew LoRA A from the unseeded global generator, so two runs of one
    training (and a resumed run and an uninterrupted one) ended with different encoders."""
    straight = _real_run(minilm, tmp_path / "a", process_seed=1)
    again = _real_run(minilm, tmp_path / "b", process_seed=2)
    with pytest.raises(Killed):
        _real_run(minilm, tmp_path / "c", process_seed=3, kill_at=3)
    resumed = _real_run(minilm, tmp_path / "c", process_seed=4)

    log = [json.loads(line) for line in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and any(r.get("grad_norm", 0) > 0 for r in log)
    want = dict(straight.named_parameters())
    for other in (again, resumed):
        got = dict(other.named_parameters())
        assert all(torch.equal(got[name], value) for name, value in want.items())
    merged = [(tmp_path / run / "final" / "encoder" / "model.safetensors").read_bytes() for run in "abc"]
    assert merged[0] == merged[1] == merged[2]
    # The merged encoder names the hosts of its training: one start, or two for the resumed run.
    records = [hostinfo.read_record(tmp_path / run / "final" / "encoder") for run in "abc"]
    assert [r["stage"] for r in records] == ["harr"] * 3 and all(r["start"] is None for r in records)
    assert [[s["from_step"] for s in r["segments"]] for r in records] == [[0], [0], [0, 2]]


def test_the_loop_aggregates_the_loss_as_configured(tmp_path, monkeypatch):
    # Trajectories of one and two retrieval steps: "grpo" and TRL's bnpo ("token-mean") weigh them
    # differently, so the two settings train different weights (after a few steps: Adam's first step
    # moves each weight by lr x the sign of its gradient, whatever the scale).
    import dataclasses

    def rollout_for(policy, index):
        def rollout(batch, step):
            gen = torch.Generator().manual_seed(1000 + step)
            trajs = []
            for group, row in enumerate(batch):
                for j in range(CFG.group_size):
                    steps = retrieve(policy, index, [row["state"]] * (1 + j % 2), pool_size=16, k=3, alpha=CFG.alpha,
                                     generator=gen)
                    hit = any(row["target"] in s.doc_ids for s in steps)
                    trajs.append(Trajectory(row["id"], group, float(hit), list(steps)))
            return trajs
        return rollout

    index = _index()
    weights = {}
    for agg in ("grpo", "token-mean"):
        policy = ToyPolicy(STATES, 8, seed=1)
        cfg = dataclasses.replace(CFG, steps=4, loss_agg=agg)
        train_retriever(policy, index, ROWS, rollout_for(policy, index), tmp_path / agg, cfg)
        weights[agg] = [p.detach().clone() for p in policy.parameters()]
    assert any(not torch.allclose(a, b) for a, b in zip(weights["grpo"], weights["token-mean"], strict=True))
