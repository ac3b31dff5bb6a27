"""The dense retriever's query encoder as an RL policy over a frozen FAISS index (HARR).

Only the query side is trained (fully, or LoRA adapters through peft); the documents keep the
vectors the index was built with, so the index is reused unchanged. One retrieval step:

1. encode the state string with the current encoder (no gradient): q;
2. search the index for the top-K pool (candidate generation; not part of the action);
3. read the pool's document vectors back from the index (`reconstruct`) and score them, s = D q;
4. draw k of the K by Plackett–Luce at temperature alpha and keep the old log-prob of that order.

Training recomputes step 3 with gradients: s' = D q'(state), the same vectors and the same
arithmetic, so before any update s' == s and the ratio is exactly 1. The authors' code instead took
old log-probs from the scores their Qdrant service returned, which were computed against the
collection's int8-quantised vectors, while training recomputed them from the full-precision ones:
an off-policy mismatch of the ratio before the first update. Here there is none for any index
type, because old scores are never FAISS's search distances. With a PQ index the reconstructed
vectors are the decoded codes: the policy then scores (and learns against) the same quantised
documents in rollout and training, consistently, and only the pool itself comes from FAISS's search.

The encoder runs in eval mode throughout (training included): dropout would make the recomputed
log-prob of an unchanged encoder differ from the old one, which is the mismatch this module removes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ragrl.errors import InputError
from ragrl.retrieval import plackett_luce as pl
from ragrl.settings import ALL_LINEAR, EncoderTraining  # noqa: F401  (stdlib settings, re-exported)

# Query texts are padded to a multiple of this many tokens (see QueryEncoderPolicy.forward).
PAD_BUCKET = 16


class QueryEncoderPolicy(torch.nn.Module):
    """A sentence-transformers query encoder that returns embeddings with gradients.

    `encoder_info` is what an index's meta.json records about its encoder (model, query_prefix,
    normalize, max_length); building the policy from it keeps queries encoded as the index expects.
    `seed` fixes the LoRA adapters' initialisation (the training's seed).
    """

    def __init__(self, encoder_info: dict[str, Any], training: EncoderTraining | None = None,
                 device: str | None = None, seed: int = 0) -> None:
        super().__init__()
        from sentence_transformers import SentenceTransformer

        from ragrl.models import resolve_model_path
        from ragrl.retrieval.encoder import default_device

        self.training_cfg = training or EncoderTraining()
        object.__setattr__(self, "_peft", None)
        self.model_name = str(encoder_info["model"])
        self.query_prefix = str(encoder_info.get("query_prefix", ""))
        self.normalize = bool(encoder_info.get("normalize", True))
        self.device_name = device or default_device()
        self.st = SentenceTransformer(resolve_model_path(self.model_name), device=self.device_name,
                                      trust_remote_code=False)
        max_length = self.training_cfg.max_length or encoder_info.get("max_length")
        if max_length:
            self.st.max_seq_length = int(max_length)
        if self.training_cfg.lora:
            from peft import LoraConfig, get_peft_model

            targets = self.training_cfg.lora_target_modules
            # get_peft_model injects the adapters into the transformer in place (the sentence-
            # transformers module keeps calling the same object); the PeftModel wrapper is kept
            # aside only to merge_and_unload at save time (add_adapter's model cannot). It draws
            # LoRA A from the global generator: seeded here, or two runs of one training differ.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                peft_model = get_peft_model(self.st[0].model, LoraConfig(
                    r=self.training_cfg.lora_r, lora_alpha=self.training_cfg.lora_alpha, lora_dropout=0.0,
                    target_modules=targets if isinstance(targets, str) else list(targets)))
            object.__setattr__(self, "_peft", peft_model)  # not a submodule: its weights are st's
        self.dim = int(self.st.get_embedding_dimension())
        if "dim" in encoder_info and int(encoder_info["dim"]) != self.dim:
            raise InputError(f"encoder {self.model_name!r} makes {self.dim}-dimensional vectors, the index holds "
                             f"{encoder_info['dim']}-dimensional ones")
        self.eval()

    def train(self, mode: bool = True) -> QueryEncoderPolicy:
        # Always eval: see the module docstring (dropout would break old == recomputed log-probs).
        return super().train(False)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def forward(self, texts: Sequence[str]) -> torch.Tensor:  # type: ignore[override]
        """[n, dim] float32 query embeddings of `texts` (query prefix added), with gradients.

        Each text is padded to a length fixed by the text alone (its token count rounded up to
        PAD_BUCKET), never to the longest text of the batch: with batch-dependent padding the same
        state came out 1e-7 different in two batches, 4e-6 in a log-prob at alpha 0.05, and the
        rollout's old log-prob would no longer be exactly what the update recomputes.

        A text given several times is encoded once: HARR's G rollouts of a question share their
        first state (the generator decodes greedily), which made 64 of a step's ~100 states 8
        copies each. Since a row's vector does not depend on its batch, this changes no vector; the
        gradients sum the copies before the encoder's backward, so they differ in float rounding only.
        """
        if not texts:
            return torch.zeros((0, self.dim), device=self.device_name)
        distinct = list(dict.fromkeys(texts))
        if len(distinct) < len(texts):
            at = {t: i for i, t in enumerate(distinct)}
            return self.forward(distinct)[torch.tensor([at[t] for t in texts], device=self.device_name)]
        tokenizer = self.st.tokenizer
        limit = int(self.st.max_seq_length)
        prefixed = [self.query_prefix + t for t in texts]
        lengths = [len(ids) for ids in tokenizer(prefixed, truncation=True, max_length=limit)["input_ids"]]
        buckets: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            buckets.setdefault(min(limit, -(-n // PAD_BUCKET) * PAD_BUCKET), []).append(i)
        parts, positions = [], []
        for length, members in sorted(buckets.items()):
            features = tokenizer([prefixed[i] for i in members], padding="max_length", truncation=True,
                                 max_length=length, return_tensors="pt")
            features = {k: v.to(self.device_name) for k, v in features.items()}
            parts.append(self.st(features)["sentence_embedding"].float())
            positions.extend(members)
        emb = torch.cat(parts)[torch.argsort(torch.tensor(positions))]
        return torch.nn.functional.normalize(emb, dim=-1) if self.normalize else emb

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        return self.forward(texts)

    def save_merged(self, out_dir: str | os.PathLike) -> None:
        """A plain sentence-transformers model directory (LoRA merged into the weights)."""
        if self.training_cfg.lora:
            import copy

            # One deepcopy of both: the copy's wrapper still wraps the copy's transformer.
            st, peft_model = copy.deepcopy((self.st, self._peft))
            st[0].model = peft_model.merge_and_unload()
            st.save(str(out_dir))
        else:
            self.st.save(str(out_dir))


# --- the pool ------------------------------------------------------------------------------------


def document_vectors(index: Any, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """The stored vectors of index rows `ids`, [n, dim] float32, as the index holds them.

    Flat and HNSW indexes return the exact vectors; IVF indexes need a direct map (made here once,
    in memory; the file on disk is untouched); PQ/SQ indexes return the decoded, quantised vectors.
    """
    import faiss

    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= index.ntotal):
        raise ValueError(f"index rows {ids.tolist()} outside 0..{index.ntotal - 1}")
    try:
        return np.asarray(index.reconstruct_batch(ids), dtype=np.float32).reshape(len(ids), index.d)
    except RuntimeError:
        try:
            ivf = faiss.extract_index_ivf(index)
        except RuntimeError as err:
            raise InputError(f"FAISS index {type(index).__name__} cannot return its stored vectors "
                             "(reconstruct); HARR needs them to score the pool") from err
        ivf.make_direct_map()
        return np.asarray(index.reconstruct_batch(ids), dtype=np.float32).reshape(len(ids), index.d)


def pool_scores(query: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """s[..., j] = <docs[..., j, :], query[..., :]>: the one place scores are computed, for the
    rollout's old log-probs and the update's new ones alike."""
    return torch.einsum("...kd,...d->...k", docs.to(query.dtype), query)


@dataclass
class RetrievalStep:
    """One retrieval action as the trainer needs it again: what was encoded, the pool (index row
    ids), the drawn order (positions in the pool) and the log-probability of that order."""

    state: str
    pool_ids: list[int]
    order: list[int]
    old_log_prob: float
    scores: list[float] = field(default_factory=list)

    @property
    def doc_ids(self) -> list[int]:
        """The index rows handed to the generator, in drawn order."""
        return [self.pool_ids[j] for j in self.order]


def retrieve(policy: QueryEncoderPolicy, index: Any, states: Sequence[str], *, pool_size: int, k: int,
             alpha: float, stochastic: bool = True, generator: torch.Generator | None = None) -> list[RetrievalStep]:
    """One retrieval step for each state: a Plackett–Luce draw (training) or the top-k (evaluation)."""
    if not states:
        return []
    queries = policy.encode(states)
    _, ids = index.search(np.ascontiguousarray(queries.cpu().numpy(), dtype=np.float32),
                          max(1, min(pool_size, index.ntotal)))
    steps = []
    for state, q, row in zip(states, queries, ids):
        pool = [int(i) for i in row if i >= 0]  # FAISS pads with -1 when it finds fewer than asked
        docs = torch.from_numpy(document_vectors(index, pool)).to(q.device)
        scores = pool_scores(q, docs)
        order = pl.sample(scores, k, alpha, generator) if stochastic else pl.greedy(scores, k)
        steps.append(RetrievalStep(state, pool, order.tolist(), float(pl.log_prob(scores, order, alpha)),
                                   scores.tolist()))
    return steps


def recompute_log_probs(policy: QueryEncoderPolicy, index: Any, steps: Sequence[RetrievalStep],
                        alpha: float) -> torch.Tensor:
    """log P(order | state) under the current encoder for each step, [n], with gradients."""
    if not steps:
        return torch.zeros(0)
    queries = policy(list(s.state for s in steps))
    out = []
    for q, step in zip(queries, steps):
        docs = torch.from_numpy(document_vectors(index, step.pool_ids)).to(q.device)
        out.append(pl.log_prob(pool_scores(q, docs), torch.tensor(step.order, device=q.device), alpha))
    return torch.stack(out)


def load_index_with_meta(index_dir: str | Path):
    """The dense index of `index_dir` and its encoder info (from meta.json)."""
    from ragrl.retrieval.dense import load_faiss_index

    dense = load_faiss_index(index_dir, use_gpu=False)
    return dense.index, dense.meta
