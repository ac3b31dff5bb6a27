"""HTTP retrieval service, wire-compatible with Search-R1's `retrieval_server.py`.

    POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}
      return_scores=true:  {"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}
      return_scores=false: {"result": [[{"id", "contents"}, ...], ...]}
    GET /health -> {"status": "ok", index info, batching counters}

During RL rollouts many workers each send a few queries at once. Encoding and searching them one
request at a time wastes the GPU/BLAS on tiny batches, so requests are micro-batched: a single
worker task gathers whatever arrives within `batch_window_ms` (up to `max_batch` queries) and runs
one search for all of it in a worker thread, leaving the event loop free to accept more requests.

Where Search-R1's own server (`search_r1/search/retrieval_server.py`) and this one agree, a
Search-R1 or RAG-R1 trainer works unchanged:
- an empty query list answers `{"result": []}` (its trainer searches every turn, even when no
  trajectory searched);
- an empty or blank query is searched like any other (dense: the encoder's embedding of the bare
  prefix; BM25: no terms, so no hits) and never fails the other queries of its request;
- `topk` missing, null or 0 means the server's default (3); a numeric string ("5") is read as a
  number, as pydantic does there;
- a request may carry thousands of queries (Search-R1 sends batch x group size at once); they are
  searched in chunks of `max_batch`, and `max_queries` (4096) is only a memory guard.
Deliberately stricter: a negative or too large `topk`, a `topk` of true/false, a query over
`max_query_chars`, or a query that is not valid Unicode (a lone surrogate) is a 4xx naming the
field, where Search-R1 would crash with a 500 or search nonsense.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ragrl.errors import InputError
from ragrl.http_server import BackgroundServer, BadBody, HttpLimits, parse_json_body, unencodable_at
from ragrl.http_server import run as run_http
from ragrl.retrieval import Hit
from ragrl.retrieval.searcher import Searcher, load_searcher

DEFAULT_PORT = 8000  # Search-R1's retrieval_server default
DEFAULT_TOPK = 3  # Search-R1's default retrieval_topk, used when a request omits topk
DEFAULT_MAX_QUERIES = 4096  # per request: a memory guard, far above Search-R1's batch x group size
_INT_TEXT = re.compile(r"\s*[+-]?\d{1,9}\s*")
# How often the batch collector looks at the queue while its window is open.
_POLL_S = 0.001

SearchFn = Callable[[list[str], int], list[list[Hit]]]


class RequestError(ValueError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    max_batch: int = 64  # queries per search call (one encode + one index search)
    max_topk: int = 50
    max_query_chars: int = 4096
    max_queries: int = DEFAULT_MAX_QUERIES  # per request; larger requests are split into max_batch chunks
    default_topk: int = DEFAULT_TOPK


def parse_request(body: Any, limits: Limits) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body; raise RequestError with a message a client can act on."""
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {type(body).__name__}")
    # Unknown fields are ignored, as Search-R1's pydantic model does, so its clients' variants work.
    queries = body.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise RequestError("'queries' must be a list of strings")
    if len(queries) > limits.max_queries:
        raise RequestError(f"too many queries: {len(queries)} > {limits.max_queries} per request", 413)
    for i, q in enumerate(queries):
        if len(q) > limits.max_query_chars:
            raise RequestError(f"queries[{i}] has {len(q)} characters, limit {limits.max_query_chars}", 413)
        if (at := unencodable_at(q)) is not None:
            raise RequestError(f"queries[{i}] is not valid Unicode (lone surrogate at character {at})")
    topk = parse_topk(body.get("topk"), limits)
    return_scores = body.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(f"'return_scores' must be true or false, got {json.dumps(return_scores)}")
    return queries, topk, return_scores


def parse_topk(topk: Any, limits: Limits) -> int:
    """Search-R1's reading of `topk`: null/0 -> the default, integral numbers and numeric strings
    as numbers (pydantic's lax int); the range check is ours."""
    if isinstance(topk, str) and _INT_TEXT.fullmatch(topk):
        topk = int(topk)
    elif isinstance(topk, float) and topk.is_integer():
        topk = int(topk)
    # bool is an int subclass in Python; `"topk": true` is a client bug, not topk=1.
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int)):
        raise RequestError(f"'topk' must be an integer, got {json.dumps(topk)[:40]}")
    if not topk:
        return limits.default_topk
    if not 1 <= topk <= limits.max_topk:
        raise RequestError(f"'topk' must be in [1, {limits.max_topk}] (0 or null: default {limits.default_topk}), got {topk}")
    return topk


def format_result(hits: list[list[Hit]], return_scores: bool) -> dict[str, Any]:
    def doc(h: Hit) -> dict[str, str]:
        return {"id": h.id, "contents": h.contents}

    if return_scores:
        return {"result": [[{"document": doc(h), "score": h.score} for h in per_q] for per_q in hits]}
    return {"result": [[doc(h) for h in per_q] for per_q in hits]}


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future


class MicroBatcher:
    """Merges concurrent requests into one search call; counts batches so merging is observable."""

    def __init__(self, search: SearchFn, max_batch: int, window_s: float) -> None:
        self.search = search
        self.max_batch = max_batch
        self.window_s = window_s
        self.stats = {"batches": 0, "requests": 0, "queries": 0, "largest_batch_queries": 0, "errors": 0}
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task | None = None
        self._carry: _Pending | None = None
        # One thread: searches run one at a time, so the searcher needs no locking, and a search
        # never competes with another for the same cores.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval-search")

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, queries: list[str], topk: int) -> list[list[Hit]]:
        self._ensure_started()
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(queries, topk, future))
        return await future

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        while True:
            await self._execute(await self._collect())

    async def _collect(self) -> list[_Pending]:
        first = self._carry or await self._queue.get()
        self._carry = None
        batch, n = [first], len(first.queries)
        deadline = time.monotonic() + self.window_s
        # Polling instead of wait_for(queue.get()): on Python 3.11 a get() cancelled by wait_for's
        # timeout can drop an item that arrived at the same moment.
        while n < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.sleep(min(remaining, _POLL_S))
                continue
            if n + len(item.queries) > self.max_batch:
                self._carry = item  # starts the next batch; requests are never split
                break
            batch.append(item)
            n += len(item.queries)
        return batch

    async def _execute(self, batch: list[_Pending]) -> None:
        queries = [q for p in batch for q in p.queries]
        # One search at the largest topk; smaller requests take a prefix (Searcher guarantees
        # rankings do not depend on topk beyond truncation).
        topk = max(p.topk for p in batch)
        try:
            results = await self._search_chunked(queries, topk)
        except Exception as exc:  # noqa: BLE001 - isolated below, or relayed as a 500
            if len(batch) > 1:
                # One request's queries must not fail the others merged with it: search each alone.
                await asyncio.gather(*(self._execute([p]) for p in batch))
                return
            self.stats["errors"] += 1
            if not batch[0].future.done():
                batch[0].future.set_exception(exc)
            return
        self.stats["batches"] += 1
        self.stats["requests"] += len(batch)
        self.stats["queries"] += len(queries)
        start = 0
        for p in batch:
            part = results[start : start + len(p.queries)]
            start += len(p.queries)
            if not p.future.done():  # the client may have gone away
                p.future.set_result([hits[: p.topk] for hits in part])

    async def _search_chunked(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Search in calls of at most max_batch queries: a 4096-query request must not become one
        4096-row encode (memory), and the calls run one after another on the search thread."""
        loop = asyncio.get_running_loop()
        results: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_batch):
            chunk = queries[start : start + self.max_batch]
            part = await loop.run_in_executor(self._executor, self.search, chunk, topk)
            if len(part) != len(chunk):
                raise RuntimeError(f"search returned {len(part)} result lists for {len(chunk)} queries")
            self.stats["largest_batch_queries"] = max(self.stats["largest_batch_queries"], len(chunk))
            results.extend(part)
        return results


def create_app(
    searcher: Searcher | SearchFn,
    max_batch: int = 64,
    max_topk: int = 50,
    batch_window_ms: float = 0.0,
    *,
    max_query_chars: int = 4096,
    max_queries: int = DEFAULT_MAX_QUERIES,
    default_topk: int = DEFAULT_TOPK,
    http_limits: HttpLimits = HttpLimits(),
) -> FastAPI:
    """The FastAPI app. `searcher` is a Searcher or any `search(queries, topk)` callable."""
    if max_batch < 1 or max_topk < 1 or batch_window_ms < 0 or max_queries < 1:
        raise InputError("max_batch, max_topk and max_queries must be >= 1 and batch_window_ms >= 0")
    limits = Limits(
        max_batch=max_batch,
        max_topk=max_topk,
        max_query_chars=max_query_chars,
        max_queries=max_queries,
        default_topk=min(default_topk, max_topk),
    )
    search = searcher.search if isinstance(searcher, Searcher) else searcher
    info = searcher.info() if isinstance(searcher, Searcher) else {}
    batcher = MicroBatcher(search, max_batch, batch_window_ms / 1000.0)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        await batcher.stop()

    app = FastAPI(title="ragrl retrieval", lifespan=lifespan)
    app.state.batcher = batcher
    app.state.http_limits = http_limits

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            **info,
            "limits": {"max_batch": max_batch, "max_topk": max_topk, "max_queries": limits.max_queries,
                       "max_query_chars": max_query_chars, "default_topk": limits.default_topk,
                       "batch_window_ms": batch_window_ms, **http_limits.as_dict()},
            "batching": dict(batcher.stats),
        }

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        try:
            queries, topk, return_scores = parse_request(parse_json_body(await request.body()), limits)
        except (BadBody, RequestError) as exc:
            return _error(exc.status, str(exc))
        if not queries:
            return JSONResponse({"result": []})  # Search-R1's answer; its trainer asks every turn
        try:
            hits = await batcher.submit(queries, topk)
        except Exception as exc:  # noqa: BLE001 - one failed search must not take the server down
            return _error(500, f"retrieval failed: {type(exc).__name__}: {exc}")
        return JSONResponse(format_result(hits, return_scores))

    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def serve(
    index_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    bm25_dir: str | Path | None = None,
    mode: str | None = None,
    max_batch: int = 64,
    max_topk: int = 50,
    max_queries: int = DEFAULT_MAX_QUERIES,
    batch_window_ms: float = 0.0,
    http_limits: HttpLimits = HttpLimits(),
    log_level: str = "info",
    **searcher_kwargs: Any,
) -> None:
    """Load the index(es) and serve until interrupted. Binds loopback unless told otherwise: the
    service has no authentication."""
    searcher = load_searcher(index_dir, bm25_dir, mode, **searcher_kwargs)
    app = create_app(searcher, max_batch=max_batch, max_topk=max_topk, batch_window_ms=batch_window_ms,
                     max_queries=max_queries, http_limits=http_limits)
    run_http(app, http_limits, host, port, log_level)


__all__ = ["BackgroundServer", "Limits", "MicroBatcher", "RequestError", "create_app", "parse_request",
           "parse_topk", "serve"]
