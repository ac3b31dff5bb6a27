"""HTTP client for the retrieval service (or any Search-R1-compatible retrieval server).

A training run that silently got empty retrievals would learn that search is useless, so the
client never returns empty results on failure: transient failures are retried with exponential
backoff, then `RetrievalUnavailable` names the URL; a rejected request raises `RetrievalError`
with the server's message at once (retrying cannot fix it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from ragrl.errors import InputError
from ragrl.http_retry import request_with_retries

from ragrl.retrieval import Hit



class RetrievalError(RuntimeError):
    """The service answered, but with an error or a malformed response."""


class RetrievalUnavailable(RetrievalError):
    """The service could not be reached (or kept failing) after all retries."""


class RetrievalClient:
    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 3,
        *,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        batch_size: int = 64,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if retries < 0 or batch_size < 1:
            raise InputError("retries must be >= 0 and batch_size >= 1")
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        # Queries per request; keep at or below the server's max_batch.
        self.batch_size = batch_size
        # `transport` lets tests inject failures (httpx.MockTransport) without a flaky network.
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health").json()

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """Top-k hits per query, in order; requests go out in chunks of `batch_size` queries."""
        queries = list(queries)
        out: list[list[Hit]] = []
        for start in range(0, len(queries), self.batch_size):
            chunk = queries[start : start + self.batch_size]
            body = {"queries": chunk, "topk": topk, "return_scores": True}
            result = self._request("POST", "/retrieve", json=body).json().get("result")
            if not isinstance(result, list) or len(result) != len(chunk):
                raise RetrievalError(f"{self.url}/retrieve returned {len(result) if isinstance(result, list) else result!r} "
                                     f"result lists for {len(chunk)} queries")
            out.extend([_hit(item) for item in per_query] for per_query in result)
        return out

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return request_with_retries(self._http, method, self.url + path, retries=self.retries, backoff=self.backoff,
                                    max_backoff=self.max_backoff, rejected=RetrievalError, unavailable=RetrievalUnavailable,
                                    service="retrieval service", **kwargs)


def _hit(item: dict[str, Any]) -> Hit:
    doc = item["document"]
    title, _, text = doc["contents"].partition("\n")
    return Hit(id=str(doc["id"]), title=title, text=text, score=float(item["score"]))
