"""Retrieval: encoders, dense (FAISS) and BM25 indexes, an in-process Searcher, and an HTTP service.

Submodules are imported lazily: the HTTP client side should not pay for importing torch/faiss.

Steps a workflow runs, each one function:
    embed_shard(...)        one cluster job per shard of passages -> .npy + sidecar .json
    build_faiss_index(...)  shards -> index dir (index.faiss + meta.json)
    build_bm25(...)         passages -> BM25 dir (bm25s arrays + JSON)
    load_searcher(...)      index dir(s) -> Searcher (dense / bm25 / hybrid)
    serve(...)              Searcher behind a Search-R1-compatible HTTP API
    RetrievalClient(...)    the trainer's side of that API
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved passage. Defined here so the HTTP client needs no torch/faiss import."""

    id: str
    title: str
    text: str
    score: float

    @property
    def contents(self) -> str:
        """The text shown to models, as in Search-R1's corpus: "{title}\\n{text}"."""
        return f"{self.title}\n{self.text}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_EXPORTS = {
    "Encoder": "encoder",
    "passage_contents": "encoder",
    "embed_shard": "dense",
    "shard_range": "dense",
    "build_faiss_index": "dense",
    "load_faiss_index": "dense",
    "DenseIndex": "dense",
    "build_bm25": "sparse",
    "load_bm25": "sparse",
    "BM25Index": "sparse",
    "Searcher": "searcher",
    "PassageStore": "searcher",
    "load_searcher": "searcher",
    "create_app": "service",
    "serve": "service",
    "BackgroundServer": "service",
    "RetrievalClient": "client",
    "RetrievalError": "client",
    "RetrievalUnavailable": "client",
}

__all__ = sorted([*_EXPORTS, "Hit"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
