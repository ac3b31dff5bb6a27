"""Sentence-transformers encoder for queries and passages.

Models such as E5 or BGE were trained with instruction prefixes ("query: ", "passage: "); an index
built with one prefix and queried with another silently loses recall, so the prefixes live in the
encoder and are recorded in every shard and index meta file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ragrl.errors import InputError
from ragrl.models import resolve_model_path
from ragrl.progress import progress
from ragrl.retrieval.st_stack import load_plain_stack

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# Texts handed to one `encode` call: large enough to keep the device busy, small enough that the
# progress line moves on CPU-only machines.
_CHUNK_BATCHES = 16


def passage_contents(table: pa.Table) -> list[str]:
    """The text models see for each passage: "{title}\\n{text}" (Search-R1's `contents`)."""
    if table.num_rows == 0:
        return []
    title, text = (pc.fill_null(table[c], "") for c in ("title", "text"))
    return pc.binary_join_element_wise(title, text, "\n").to_pylist()


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Encoder:
    """Encodes queries and passages into float32 (by default L2-normalised) vectors."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        query_prefix: str = "",
        passage_prefix: str = "",
        batch_size: int = 64,
        max_length: int | None = None,
        normalize: bool = True,
        device: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {batch_size}")
        self.model_name = model
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.batch_size = batch_size
        self.normalize = normalize
        self.device = device or default_device()
        path = resolve_model_path(model)
        # Imported here: torch + transformers cost seconds, which the BM25-only paths and the HTTP
        # client never need; sentence-transformers adds ~3.5 s more (its training stack), so it is
        # only imported for stacks that st_stack cannot replay bit for bit.
        self._model = load_plain_stack(path, self.device)
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(path, device=self.device, trust_remote_code=False)
        if max_length is not None:
            self._model.max_seq_length = max_length
        self.max_length = self._model.max_seq_length
        self.dim = int(self._model.get_embedding_dimension())

    def info(self) -> dict[str, Any]:
        """What an index must record so that queries are later encoded the same way."""
        return {
            "model": self.model_name,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "normalize": self.normalize,
            "max_length": self.max_length,
            "dim": self.dim,
        }

    def encode_queries(self, queries: Sequence[str], show_progress: bool = False) -> np.ndarray:
        return self._encode([self.query_prefix + q for q in queries], "encode queries", show_progress)

    def encode_passages(self, passages: Sequence[str], show_progress: bool = True) -> np.ndarray:
        return self._encode([self.passage_prefix + p for p in passages], "encode passages", show_progress)

    def _encode(self, texts: list[str], desc: str, show_progress: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        chunk = self.batch_size * _CHUNK_BATCHES
        starts = range(0, len(texts), chunk)
        if show_progress:
            starts = progress(starts, desc=f"{desc} ({chunk} texts/chunk)", unit="chunk")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in starts:
            emb = self._model.encode(
                texts[start : start + chunk],
                batch_size=self.batch_size,
                normalize_embeddings=self.normalize,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            out[start : start + len(emb)] = emb  # casts fp16/bf16 models to the float32 contract
        return out
