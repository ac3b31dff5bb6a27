"""KG server, wire-compatible with KG-R1's `/retrieve`: a batch of one-hop operations per request.

    POST /retrieve  [{"action_type": "get_entities_out", "dataset_name": "webqsp", "sample_id": "WebQTest-0",
                      "entity_id": "Ada Lovelace", "relation": "place of birth"}, ...]
                    (or {"requests": [...]})
        -> [{"status": "success", "message": "...", "results": [...], "total": n, "action_type": ...}, ...]
    GET /health     -> {"status": "ok", "datasets": {...}, "limits": {...}}

Per-item problems the policy caused (unknown function, missing or overlong entity, unknown entity
or relation) come back inline as typed results, as in KG-R1, so one bad query never fails its
batch. Requests that no policy could have produced (not JSON, wrong JSON types, too many items,
too large a body) get a 4xx with {"error": ...}; the server keeps serving.

`dataset_name` picks a KG by name (case-insensitive; with a single unnamed store any name is
accepted). In subgraph mode `sample_id` picks the question's subgraph; in whole mode it is
ignored.

There is no SQL, SPARQL or other query language behind this: entity and relation strings from
the model are dictionary keys into numpy arrays and are never interpolated into code or queries.

In-process mode: `KGService.retrieve(...)` is the function the HTTP route calls, usable directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ragrl.kg.ops import (
    DEFAULT_LIMITS,
    MESSAGE_PREFIX,
    OPERATIONS,
    USAGE,
    OpLimits,
    OpResult,
    Status,
    canonical_name,
    execute,
)
from ragrl.kg.store import KGSource, KGStore, load_kg

DEFAULT_PORT = 8001  # next to the retrieval service's 8000
DEFAULT_DATASET = "default"
REQUEST_FIELDS = ("action_type", "dataset_name", "sample_id", "entity_id", "relation")


class RequestError(ValueError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServerLimits:
    max_batch: int = 512  # items per request
    max_body_bytes: int = 4 * 1024 * 1024
    max_field_chars: int = 4096  # longer strings are rejected outright; ops cap arguments far lower


@dataclass(frozen=True)
class KGRequest:
    action_type: str
    dataset_name: str | None = None
    sample_id: str | None = None
    entity_id: str | None = None
    relation: str | None = None


# --------------------------------------------------------------------------- request validation


def parse_batch(body: Any, limits: ServerLimits = ServerLimits()) -> list[KGRequest]:
    """Validate a /retrieve body (a list, or {"requests": list}); raise RequestError naming the item."""
    if isinstance(body, dict):
        if "requests" not in body:
            raise RequestError("a JSON object body needs a 'requests' list; or send the list itself")
        body = body["requests"]
    if not isinstance(body, list):
        raise RequestError(f"request body must be a JSON list of request objects, got {type(body).__name__}")
    if not body:
        raise RequestError("empty batch")
    if len(body) > limits.max_batch:
        raise RequestError(f"too many requests: {len(body)} > {limits.max_batch} per batch", 413)
    return [_parse_item(i, item, limits) for i, item in enumerate(body)]


def _parse_item(i: int, item: Any, limits: ServerLimits) -> KGRequest:
    if not isinstance(item, dict):
        raise RequestError(f"requests[{i}] must be an object, got {type(item).__name__}")
    values: dict[str, str | None] = {}
    for name in REQUEST_FIELDS:  # unknown fields (KG-R1's "concept") are ignored
        value = item.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and name == "sample_id":
            value = str(value)  # numeric question ids are common in KGQA dumps
        if value is not None and not isinstance(value, str):
            raise RequestError(f"requests[{i}].{name} must be a string or null, got {json.dumps(value)[:60]}")
        if value is not None and len(value) > limits.max_field_chars:
            raise RequestError(f"requests[{i}].{name} has {len(value)} characters, limit {limits.max_field_chars}", 413)
        values[name] = value
    if values["action_type"] is None:
        raise RequestError(f"requests[{i}].action_type is missing")
    return KGRequest(**values)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- execution


class KGService:
    """The KG sources plus the batch function behind /retrieve (also the in-process backend)."""

    def __init__(self, store_or_stores: KGStore | KGSource | Mapping[str, KGStore | KGSource],
                 limits: OpLimits = DEFAULT_LIMITS, server_limits: ServerLimits = ServerLimits()) -> None:
        self.sources = _sources(store_or_stores)
        self.limits = limits
        self.server_limits = server_limits
        self._by_folded = {name.casefold(): src for name, src in self.sources.items()}

    def source(self, dataset_name: str | None) -> KGSource | None:
        if len(self.sources) == 1 and DEFAULT_DATASET in self.sources:
            return self.sources[DEFAULT_DATASET]
        if dataset_name is None:
            return next(iter(self.sources.values())) if len(self.sources) == 1 else None
        return self._by_folded.get(dataset_name.casefold())

    def run(self, request: KGRequest) -> OpResult:
        fn = canonical_name(request.action_type)
        if fn is None:
            return execute(_NO_STORE, request.action_type, ())  # the "unknown function" message
        source = self.source(request.dataset_name)
        if source is None:
            return OpResult(Status.DATASET_NOT_FOUND, MESSAGE_PREFIX[Status.DATASET_NOT_FOUND]
                            + f"unknown dataset {request.dataset_name!r}; available: {sorted(self.sources)}", op=fn)
        store = source.store_for(request.sample_id)
        if store is None:
            return OpResult(Status.SAMPLE_NOT_FOUND, MESSAGE_PREFIX[Status.SAMPLE_NOT_FOUND]
                            + f"no subgraph for sample_id {request.sample_id!r} in dataset {source.name!r}", op=fn)
        args = [request.entity_id, request.relation][: OPERATIONS[fn].arity]
        return execute(store, request.action_type, args, self.limits)

    def retrieve(self, body: Any) -> list[dict]:
        """A /retrieve body (list or {"requests": list}, or KGRequest objects) -> one result dict per item."""
        if isinstance(body, list) and body and all(isinstance(b, KGRequest) for b in body):
            requests = body
        else:
            requests = parse_batch(body, self.server_limits)
        return [self.run(r).to_dict() for r in requests]

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "service": "kg", "datasets": {n: s.info() for n, s in self.sources.items()},
                "operations": list(OPERATIONS), "limits": {**asdict(self.limits), **asdict(self.server_limits)}}


# An empty store: only used to render "unknown function" before any dataset lookup.
_NO_STORE = KGStore([], [], [], [], [])


def _sources(obj) -> dict[str, KGSource]:
    if isinstance(obj, KGStore):
        return {DEFAULT_DATASET: KGSource(DEFAULT_DATASET, obj.warm())}
    if isinstance(obj, KGSource):
        return {obj.name: obj}
    if isinstance(obj, Mapping) and obj:
        out = {}
        for name, value in obj.items():
            if isinstance(value, KGStore):
                value = KGSource(str(name), value.warm())
            if not isinstance(value, KGSource):
                raise TypeError(f"dataset {name!r}: expected a KGStore or KGSource, got {type(value).__name__}")
            out[str(name)] = value
        if len({n.casefold() for n in out}) != len(out):
            raise ValueError(f"dataset names differ only in case: {sorted(out)}")
        return out
    raise TypeError(f"expected a KGStore, a KGSource or a non-empty mapping of them, got {type(obj).__name__}")


# --------------------------------------------------------------------------- HTTP


def create_app(store_or_stores: KGStore | KGSource | Mapping[str, KGStore | KGSource] | KGService,
               limits: OpLimits = DEFAULT_LIMITS, server_limits: ServerLimits = ServerLimits()) -> FastAPI:
    """The FastAPI app over one store, one source, or a mapping dataset name -> store/source."""
    service = (store_or_stores if isinstance(store_or_stores, KGService)
               else KGService(store_or_stores, limits, server_limits))
    app = FastAPI(title="ragrl KG server")
    app.state.service = service

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return service.health()

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        raw = await request.body()
        if len(raw) > service.server_limits.max_body_bytes:
            return _error(413, f"request body has {len(raw)} bytes, limit {service.server_limits.max_body_bytes}")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        try:
            requests = parse_batch(body, service.server_limits)
        except RequestError as exc:
            return _error(exc.status, str(exc))
        try:
            # Lookups are CPU work (and a subgraph may be built); keep the event loop free for other clients.
            results = await run_in_threadpool(service.retrieve, requests)
        except Exception as exc:  # noqa: BLE001 - one failing batch must not take the server down
            return _error(500, f"KG lookup failed: {type(exc).__name__}: {exc}")
        return JSONResponse(results)

    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "usage": USAGE}, status_code=status)


def serve(kg_dir: str | os.PathLike | Mapping[str, str | os.PathLike], host: str = "127.0.0.1",
          port: int = DEFAULT_PORT, *, mode: str = "whole", limits: OpLimits = DEFAULT_LIMITS,
          server_limits: ServerLimits = ServerLimits(), log_level: str = "info", **load_kwargs: Any) -> None:
    """Load KG(s) and serve until interrupted. `kg_dir` is one directory (see `store.load_kg`) or a
    mapping dataset name -> directory. Binds loopback unless told otherwise: there is no authentication."""
    import uvicorn

    dirs = kg_dir if isinstance(kg_dir, Mapping) else {None: kg_dir}
    sources = {}
    for name, path in dirs.items():
        source = load_kg(Path(path), mode, name=name, **load_kwargs)
        sources[source.name] = source
    app = create_app(sources, limits, server_limits)
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)
