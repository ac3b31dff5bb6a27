"""HARR's query-encoder policy over a real FAISS index: old log-probs equal the recomputed ones."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from ragrl.retrieval.dense import build_faiss_index, load_faiss_index, write_embeddings
from ragrl.retrieval.encoder import Encoder
from ragrl.train.retriever_policy import (
    EncoderTraining,
    QueryEncoderPolicy,
    document_vectors,
    recompute_log_probs,
    retrieve,
)

from harr_helpers import one_thread  # noqa: F401  (autouse: one OpenMP thread)

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
NAMES = ["Daifan Jaitheam", "Orla Venmark", "Teslo Quivar", "Mirel Dostan", "Kaveh Ombrin", "Sune Parlow",
         "Idra Volkin", "Bexo Tannick"]
CITIES = ["Velmora", "Ostrel", "Quanby", "Dresk", "Pelloway", "Thune", "Arvik", "Sorrel"]
PASSAGES = [f"{n} was born in {c} and later founded a workshop there." for n in NAMES for c in CITIES]  # 64
STATES = ["Query: Where was Daifan Jaitheam born?",
          'Original Question: Who was born in Ostrel?\nHistory: []\nQuery: born in Ostrel',
          "Query: Teslo Quivar workshop",
          "Query: Sune Parlow birthplace"]
K, TOPK, ALPHA = 12, 3, 0.05


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("harr_index")
    encoder = Encoder(MODEL, batch_size=32)
    emb = encoder.encode_passages(PASSAGES, show_progress=False)
    write_embeddings(emb, root / "emb.npy", {**encoder.info(), "start": 0, "stop": len(PASSAGES),
                                             "num_passages": len(PASSAGES)})
    dirs = {}
    for factory in ("Flat", "IVF4,Flat", "IVF4,PQ8x4"):
        dirs[factory] = root / factory.replace(",", "_")
        build_faiss_index([root / "emb.npy"], factory, dirs[factory], train_sample=64)
    return encoder, emb, dirs


@pytest.fixture(scope="module")
def policy(built):
    torch.manual_seed(0)
    return QueryEncoderPolicy(built[0].info(), EncoderTraining(lora=True, lora_r=4, lora_alpha=8), device="cpu")


def _index(built, factory):
    return load_faiss_index(built[2][factory], use_gpu=False, nprobe=4).index


@pytest.mark.parametrize("factory", ["Flat", "IVF4,PQ8x4"])
def test_old_log_probs_equal_recomputed_before_any_update(built, policy, factory):
    index = _index(built, factory)
    steps = retrieve(policy, index, STATES, pool_size=K, k=TOPK, alpha=ALPHA,
                     generator=torch.Generator().manual_seed(3))
    assert [len(s.pool_ids) for s in steps] == [K] * len(STATES)
    old = torch.tensor([s.old_log_prob for s in steps])
    # Another batch composition (reversed, and one state alone) must not change the numbers.
    together = recompute_log_probs(policy, index, steps[::-1], ALPHA).detach().flip(0)
    alone = torch.cat([recompute_log_probs(policy, index, [s], ALPHA).detach() for s in steps])
    torch.testing.assert_close(together, old, rtol=0, atol=1e-6)
    torch.testing.assert_close(alone, old, rtol=0, atol=1e-6)


def test_reconstructed_vectors_are_the_index_vectors(built):
    _, emb, _ = built
    rows = [5, 0, 63, 17]
    for factory in ("Flat", "IVF4,Flat"):
        np.testing.assert_array_equal(document_vectors(_index(built, factory), rows), emb[rows])
    # PQ stores codes: its vectors are the decoded, quantised ones, and the policy scores those
    # (consistently in rollout and update), not the encoder's exact passage vectors.
    pq = document_vectors(_index(built, "IVF4,PQ8x4"), rows)
    assert pq.shape == (4, emb.shape[1]) and np.abs(pq - emb[rows]).max() > 1e-3
    with pytest.raises(ValueError, match="outside"):
        document_vectors(_index(built, "Flat"), [64])


def test_pool_scores_are_faiss_scores_on_a_flat_index(built, policy):
    index = _index(built, "Flat")
    step = retrieve(policy, index, STATES[:1], pool_size=K, k=TOPK, alpha=ALPHA, stochastic=False)[0]
    distances, ids = index.search(policy.encode(STATES[:1]).numpy(), K)
    assert step.pool_ids == ids[0].tolist()
    np.testing.assert_allclose(step.scores, distances[0], atol=1e-5)
    assert step.order == [0, 1, 2]  # deterministic top-k keeps FAISS's ranking


def test_a_repeated_state_is_encoded_once_with_the_same_vector_and_gradient(built, policy):
    # HARR's G rollouts of a question share their first state: the copies go through the encoder
    # once, and the vectors and the gradient are what encoding every copy gives.
    states = [STATES[0], STATES[1], STATES[0], STATES[0], STATES[2]]
    seen: list[int] = []
    hook = policy.st.register_forward_pre_hook(lambda module, args: seen.append(len(args[0]["input_ids"])))
    try:
        out = policy(states)
    finally:
        hook.remove()
    assert sum(seen) == 3
    copies = torch.cat([policy([s]) for s in states]).detach()
    torch.testing.assert_close(out.detach(), copies, rtol=0, atol=0)

    # A loss that weighs each copy differently, through the batch and one copy at a time.
    weights = torch.arange(1.0, len(states) + 1)[:, None]
    policy.zero_grad(set_to_none=True)
    (policy(states) * weights).sum().backward()
    deduped = [p.grad.clone() for p in policy.trainable_parameters() if p.grad is not None]
    policy.zero_grad(set_to_none=True)
    for s, w in zip(states, weights):
        (policy([s]) * w).sum().backward()
    summed = [p.grad.clone() for p in policy.trainable_parameters() if p.grad is not None]
    policy.zero_grad(set_to_none=True)
    assert len(deduped) == len(summed) > 0
    for a, b in zip(deduped, summed):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_untrained_lora_policy_is_the_frozen_encoder(built, policy):
    frozen = built[0].encode_queries(STATES)
    np.testing.assert_allclose(policy.encode(STATES).numpy(), frozen, atol=1e-5)
    assert not policy.training  # dropout stays off even when asked to train
    policy.train()
    assert not policy.st.training


def test_update_moves_the_log_prob_and_merge_keeps_the_policy(built, tmp_path):
    torch.manual_seed(1)
    pol = QueryEncoderPolicy(built[0].info(), EncoderTraining(lora=True, lora_r=4, lora_alpha=8), device="cpu")
    index = _index(built, "Flat")
    steps = retrieve(pol, index, STATES, pool_size=K, k=TOPK, alpha=ALPHA, generator=torch.Generator().manual_seed(5))
    trainable = pol.trainable_parameters()
    assert trainable and all("lora" in n for n, p in pol.named_parameters() if p.requires_grad)
    opt = torch.optim.SGD(trainable, lr=0.5)
    before = recompute_log_probs(pol, index, steps, ALPHA)
    before.sum().backward()  # ascend the log-prob of the drawn orders
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in trainable)
    for p in trainable:
        if p.grad is not None:  # LoRA on BERT's pooler: sentence-transformers mean-pools, never uses it
            p.grad = -p.grad
    opt.step()
    after = recompute_log_probs(pol, index, steps, ALPHA).detach()
    assert float(after.sum()) > float(before.detach().sum())
    pol.save_merged(tmp_path / "merged")
    merged = Encoder(str(tmp_path / "merged"))
    np.testing.assert_allclose(merged.encode_queries(STATES), pol.encode(STATES).numpy(), atol=1e-5)
