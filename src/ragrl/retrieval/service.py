"""HTTP retrieval service, wire-compatible with Search-R1's `retrieval_server.py`.

    POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}
      return_scores=true:  {"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}
      return_scores=false: {"result": [[{"id", "contents"}, ...], ...]}
    GET /health -> {"status": "ok", index info, batching counters}

During RL rollouts many workers each send a few queries at once. Encoding and searching them one
request at a time wastes the GPU/BLAS on tiny batches, so requests are micro-batched: a single
worker task gathers whatever arrives within `batch_window_ms` (up to `max_batch` queries) and runs
one search for all of it in a worker thread, leaving the event loop free to accept more requests.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ragrl.retrieval import Hit
from ragrl.retrieval.searcher import Searcher, load_searcher

DEFAULT_PORT = 8000  # Search-R1's retrieval_server default
DEFAULT_TOPK = 3  # Search-R1's default retrieval_topk, used when a request omits topk
# How often the batch collector looks at the queue while its window is open.
_POLL_S = 0.001

SearchFn = Callable[[list[str], int], list[list[Hit]]]


class RequestError(ValueError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    max_batch: int = 64
    max_topk: int = 50
    max_query_chars: int = 4096
    max_queries: int = 64  # per request; a request never has to be split across batches
    default_topk: int = DEFAULT_TOPK


def parse_request(body: Any, limits: Limits) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body; raise RequestError with a message a client can act on."""
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {type(body).__name__}")
    # Unknown fields are ignored, as Search-R1's pydantic model does, so its clients' variants work.
    queries = body.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise RequestError("'queries' must be a list of strings")
    if not queries:
        raise RequestError("'queries' is empty")
    if len(queries) > limits.max_queries:
        raise RequestError(f"too many queries: {len(queries)} > {limits.max_queries} per request", 413)
    for i, q in enumerate(queries):
        if not q.strip():
            raise RequestError(f"queries[{i}] is empty")
        if len(q) > limits.max_query_chars:
            raise RequestError(f"queries[{i}] has {len(q)} characters, limit {limits.max_query_chars}", 413)
    topk = body.get("topk")
    if topk is None:
        topk = limits.default_topk
    # bool is an int subclass in Python; `"topk": true` is a client bug, not topk=1.
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise RequestError(f"'topk' must be an integer, got {json.dumps(topk)}")
    if not 1 <= topk <= limits.max_topk:
        raise RequestError(f"'topk' must be in [1, {limits.max_topk}], got {topk}")
    return_scores = body.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(f"'return_scores' must be true or false, got {json.dumps(return_scores)}")
    return queries, topk, return_scores


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
            results = await asyncio.get_running_loop().run_in_executor(self._executor, self.search, queries, topk)
        except Exception as exc:  # noqa: BLE001 - relayed to every waiting request as a 500
            self.stats["errors"] += 1
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        self.stats["batches"] += 1
        self.stats["requests"] += len(batch)
        self.stats["queries"] += len(queries)
        self.stats["largest_batch_queries"] = max(self.stats["largest_batch_queries"], len(queries))
        start = 0
        for p in batch:
            part = results[start : start + len(p.queries)]
            start += len(p.queries)
            if not p.future.done():  # the client may have gone away
                p.future.set_result([hits[: p.topk] for hits in part])


def create_app(
    searcher: Searcher | SearchFn,
    max_batch: int = 64,
    max_topk: int = 50,
    batch_window_ms: float = 0.0,
    *,
    max_query_chars: int = 4096,
    max_queries: int | None = None,
    default_topk: int = DEFAULT_TOPK,
) -> FastAPI:
    """The FastAPI app. `searcher` is a Searcher or any `search(queries, topk)` callable."""
    if max_batch < 1 or max_topk < 1 or batch_window_ms < 0:
        raise ValueError("max_batch and max_topk must be >= 1 and batch_window_ms >= 0")
    limits = Limits(
        max_batch=max_batch,
        max_topk=max_topk,
        max_query_chars=max_query_chars,
        max_queries=min(max_queries or max_batch, max_batch),
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

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            **info,
            "limits": {"max_batch": max_batch, "max_topk": max_topk, "max_queries": limits.max_queries,
                       "max_query_chars": max_query_chars, "batch_window_ms": batch_window_ms},
            "batching": dict(batcher.stats),
        }

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        try:
            queries, topk, return_scores = parse_request(body, limits)
        except RequestError as exc:
            return _error(exc.status, str(exc))
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
    batch_window_ms: float = 0.0,
    log_level: str = "info",
    **searcher_kwargs: Any,
) -> None:
    """Load the index(es) and serve until interrupted. Binds loopback unless told otherwise: the
    service has no authentication."""
    import uvicorn

    searcher = load_searcher(index_dir, bm25_dir, mode, **searcher_kwargs)
    app = create_app(searcher, max_batch=max_batch, max_topk=max_topk, batch_window_ms=batch_window_ms)
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)


class BackgroundServer:
    """Runs an app under uvicorn in a daemon thread (tests, or a trainer hosting its own retriever).

    Binds the socket itself, so port=0 gives a free ephemeral port with no race to find one.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"retrieval server at {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
