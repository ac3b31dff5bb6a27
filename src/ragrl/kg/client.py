"""HTTP client for the KG server (ours or KG-R1's: the same `/retrieve` request shape).

As with the retrieval client, a failure is never turned into empty observations: transient
failures (connection errors, timeouts, 429/502/503/504) are retried with exponential backoff and
then raise `KGServiceUnavailable` naming the URL; a rejected request (other 4xx/5xx) raises
`KGServiceError` with the server's message at once, since retrying cannot fix it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from ragrl.http_retry import request_with_retries



class KGServiceError(RuntimeError):
    """The KG server answered, but with an error or a malformed response."""


class KGServiceUnavailable(KGServiceError):
    """The KG server could not be reached (or kept failing) after all retries."""


class KGClient:
    def __init__(self, url: str, timeout: float = 30.0, retries: int = 3, *, backoff: float = 0.5,
                 max_backoff: float = 8.0, batch_size: int = 256, transport: httpx.BaseTransport | None = None) -> None:
        if retries < 0 or batch_size < 1:
            raise ValueError("retries must be >= 0 and batch_size >= 1")
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.batch_size = batch_size  # keep at or below the server's max_batch
        # `transport` lets tests inject failures (httpx.MockTransport) without a flaky network.
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KGClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health").json()

    def retrieve(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """One result dict per request item, in order; batches of `batch_size` per HTTP call."""
        requests = list(requests)
        out: list[dict[str, Any]] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            response = self._request("POST", "/retrieve", json=chunk)
            try:
                results = response.json()
            except ValueError as exc:
                raise KGServiceError(f"{self.url}/retrieve returned non-JSON: {response.text[:200]!r}") from exc
            if not isinstance(results, list) or len(results) != len(chunk):
                got = len(results) if isinstance(results, list) else type(results).__name__
                raise KGServiceError(f"{self.url}/retrieve returned {got} results for {len(chunk)} requests")
            for i, item in enumerate(results):
                if not (isinstance(item, dict) and isinstance(item.get("status"), str)
                        and isinstance(item.get("message"), str)):
                    raise KGServiceError(f"{self.url}/retrieve result {start + i} lacks 'status'/'message': "
                                         f"{str(item)[:200]}")
            out.extend(results)
        return out

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return request_with_retries(self._http, method, self.url + path, retries=self.retries, backoff=self.backoff,
                                    max_backoff=self.max_backoff, rejected=KGServiceError, unavailable=KGServiceUnavailable,
                                    service="KG server", **kwargs)
