"""One HTTP request with retries, shared by the clients of our services (retrieval, KG).

A training run that silently got empty observations would learn that its tool is useless, so a
client never turns a failure into an empty result: transient failures (connection errors,
timeouts, 429/502/503/504) are retried with exponential backoff and then raise `unavailable`
naming the URL; a rejected request (any other status >= 400) raises `rejected` with the server's
message at once, since retrying cannot fix it.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

# Statuses that mean "try again later" rather than "your request is wrong".
RETRY_STATUS = frozenset({429, 502, 503, 504})


def backoff_delay(attempt: int, backoff: float, max_backoff: float) -> float:
    """Seconds to wait before retry `attempt` (1-based): doubling from `backoff`, capped."""
    return min(backoff * 2 ** (attempt - 1), max_backoff)


def request_with_retries(http: httpx.Client, method: str, url: str, *, retries: int, backoff: float,
                         max_backoff: float, rejected: type[Exception], unavailable: type[Exception],
                         service: str, **kwargs: Any) -> httpx.Response:
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_delay(attempt, backoff, max_backoff))
        try:
            response = http.request(method, url, **kwargs)
        except httpx.TransportError as exc:  # connect errors, timeouts, dropped connections
            last = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code in RETRY_STATUS:
            last = f"HTTP {response.status_code}: {error_message(response)}"
            continue
        if response.status_code >= 400:
            raise rejected(f"{url} rejected the request (HTTP {response.status_code}): {error_message(response)}")
        return response
    raise unavailable(f"{service} at {url} unavailable after {retries + 1} attempts ({last})")


def error_message(response: httpx.Response) -> str:
    """The server's error text: the `error` field of a JSON body, else the body, shortened."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    return str(body.get("error", body))[:500] if isinstance(body, dict) else str(body)[:500]


def api_url(base_url: str, path: str) -> str:
    """`{base_url}/v1/{path}` for an OpenAI-compatible server given with or without its `/v1`
    (vLLM's URL is the server root; OpenAI's is documented with /v1)."""
    root = base_url.rstrip("/")
    return f"{root}/{path}" if root.endswith("/v1") else f"{root}/v1/{path}"
