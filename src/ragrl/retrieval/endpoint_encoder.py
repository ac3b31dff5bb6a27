"""An embedding model behind an OpenAI-compatible `/v1/embeddings` endpoint (vLLM's pooling
runner, e.g. `vllm serve Qwen/Qwen3-Embedding-0.6B --runner pooling`), with the in-process
`Encoder`'s contract: float32 rows, L2-normalised, in input order.

AutoGraph-R1 serves its reward's embedder this way; a failed request raises (an empty or zero
vector would silently rank passages at random and train the constructor against noise).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import numpy as np

from ragrl.errors import InputError
from ragrl.http_retry import api_url, request_with_retries


class EmbeddingError(RuntimeError):
    """The endpoint failed, or answered something that is not an embeddings response."""


class EndpointEncoder:
    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, batch_size: int = 64,
                 timeout_s: float = 120.0, retries: int = 3, query_prefix: str = "",
                 transport: httpx.BaseTransport | None = None) -> None:
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {batch_size}")
        self.url = api_url(base_url, "embeddings")
        self.model, self.batch_size, self.retries, self.query_prefix = model, batch_size, retries, query_prefix
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)

    def close(self) -> None:
        self._http.close()

    def encode_queries(self, queries: Sequence[str], show_progress: bool = False) -> np.ndarray:
        texts = [self.query_prefix + q for q in queries]
        rows = [row for start in range(0, len(texts), self.batch_size)
                for row in self._batch(texts[start:start + self.batch_size])]
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        out = np.asarray(rows, dtype=np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)

    def _batch(self, texts: list[str]) -> list[list[float]]:
        response = request_with_retries(self._http, "POST", self.url, retries=self.retries, backoff=0.5,
                                        max_backoff=8.0, rejected=EmbeddingError, unavailable=EmbeddingError,
                                        service="embedding endpoint", json={"model": self.model, "input": texts})
        try:
            data = sorted(response.json()["data"], key=lambda d: d["index"])
            rows = [[float(x) for x in d["embedding"]] for d in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingError(f"{self.url} answered without data[].embedding: {response.text[:200]!r}") from exc
        if len(rows) != len(texts) or len({len(r) for r in rows}) != 1:
            raise EmbeddingError(f"{self.url} returned {len(rows)} embeddings of sizes {sorted({len(r) for r in rows})} "
                                 f"for {len(texts)} texts")
        return rows
