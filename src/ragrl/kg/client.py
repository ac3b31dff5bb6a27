"""HTTP client for the KG server (ours or KG-R1's: the same `/retrieve` request shape).

Results come back in our shape (`status`, `message`, ...) whichever server answered. A KG-R1
server's item (`object: "kg_retrieval"`, `choices[0].message.content`, `kg_metadata.error_type`)
is translated: its error type becomes our status, and the message gets our status marker (the
"Entity not found: " prefix, or the echoed call for a success) in front of KG-R1's text, because
our per-turn rewards classify an observation by that marker (`ops.status_of_message`).

As with the retrieval client, a failure is never turned into empty observations: transient
failures (connection errors, timeouts, 429/502/503/504) are retried with exponential backoff and
then raise `KGServiceUnavailable` naming the URL; a rejected request (other 4xx/5xx) raises
`KGServiceError` with the server's message at once, since retrying cannot fix it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from ragrl.errors import InputError
from ragrl.http_retry import request_with_retries
from ragrl.kg.ops import MESSAGE_PREFIX, OPERATIONS, Status, canonical_name, format_call

# KG-R1's error types (kg_r1/search/error_types.py) -> our statuses. KG_SERVER_ERROR (unknown
# dataset or action) is a pipeline problem, so it maps to a status the environment raises on.
FROM_KG_R1 = {
    "KG_SUCCESS": Status.SUCCESS,
    "KG_FORMAT_ERROR": Status.FORMAT_ERROR,
    "KG_ENTITY_NOT_FOUND": Status.ENTITY_NOT_FOUND,
    "KG_RELATION_NOT_FOUND": Status.RELATION_NOT_FOUND,
    "KG_NO_RESULTS": Status.NO_RESULTS,
    "KG_SAMPLE_NOT_FOUND": Status.SAMPLE_NOT_FOUND,
    "KG_SERVER_ERROR": Status.INTERNAL_ERROR,
}



class KGServiceError(RuntimeError):
    """The KG server answered, but with an error or a malformed response."""


class KGServiceUnavailable(KGServiceError):
    """The KG server could not be reached (or kept failing) after all retries."""


class KGClient:
    def __init__(self, url: str, timeout: float = 30.0, retries: int = 3, *, backoff: float = 0.5,
                 max_backoff: float = 8.0, batch_size: int = 256, transport: httpx.BaseTransport | None = None,
                 dataset_name: str | None = None) -> None:
        if retries < 0 or batch_size < 1:
            raise InputError("retries must be >= 0 and batch_size >= 1")
        self.url = url.rstrip("/")
        # What a KGEnvironment over this client names in each query (KG-R1's dataset_name): its
        # server requires one, and a serve-kg of several KGs picks the KG by it.
        self.dataset_name = dataset_name
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
            for i, (request, item) in enumerate(zip(chunk, results)):
                ours = as_our_result(item, request)
                if ours is None:
                    raise KGServiceError(f"{self.url}/retrieve result {start + i} is neither our shape "
                                         f"('status'/'message') nor KG-R1's: {str(item)[:200]}")
                out.append(ours)
        return out

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return request_with_retries(self._http, method, self.url + path, retries=self.retries, backoff=self.backoff,
                                    max_backoff=self.max_backoff, rejected=KGServiceError, unavailable=KGServiceUnavailable,
                                    service="KG server", **kwargs)


def as_our_result(item: Any, request: dict[str, Any]) -> dict[str, Any] | None:
    """A result item in our shape, from ours (kept as is) or KG-R1's; None if it is neither."""
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("status"), str) and isinstance(item.get("message"), str):
        return item
    if item.get("object") != "kg_retrieval":
        return None
    meta = item.get("kg_metadata") if isinstance(item.get("kg_metadata"), dict) else {}
    choices = item.get("choices")
    try:
        content = choices[0]["message"]["content"]
    except (TypeError, LookupError):
        return None
    if not isinstance(content, str):
        return None
    status = FROM_KG_R1.get(meta.get("error_type"))
    if status is None:  # an older KG-R1 without error types: only `success` to go by
        status = Status.SUCCESS if item.get("success") else Status.NO_RESULTS
    action = str(request.get("action_type") or item.get("action") or "")
    return {"status": status.value, "message": _marked(status, content, action, request), "results": [],
            "total": 0, "action_type": action}


def _marked(status: Status, content: str, action: str, request: dict[str, Any]) -> str:
    if status is not Status.SUCCESS:
        prefix = MESSAGE_PREFIX[status]
        return content if content.startswith(prefix) else prefix + content
    fn = canonical_name(action)
    arity = OPERATIONS[fn].arity if fn else 2
    args = [str(a) for a in (request.get("entity_id"), request.get("relation"))[:arity] if a is not None]
    return f"{format_call(action.strip().lower(), *args)}:\n{content}"
