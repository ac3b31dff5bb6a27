"""KG server, wire-compatible with KG-R1's `/retrieve` (`kg_r1/search/server.py`): a batch of
one-hop operations per request.

    POST /retrieve  [{"action_type": "get_entities_out", "dataset_name": "webqsp", "sample_id": "WebQTest-0",
                      "entity_id": "Ada Lovelace", "relation": "place of birth"}, ...]
                    (or {"requests": [...]})
        -> one item per request, in order, carrying both shapes:
           KG-R1's  {"object": "kg_retrieval", "success", "action", "choices": [{"message": {"content"}}],
                     "kg_metadata": {"action_type", "success", "error_type": "KG_ENTITY_NOT_FOUND", ...}, ...}
           ours     {"status": "entity_not_found", "message", "results", "total", "action_type"}
    GET /actions    -> KG-R1's listing: {"actions", "supported_actions", "supported_kgs", "action_details"}
    GET /health     -> {"status": "ok", "datasets": {...}, "limits": {...}}

Compatible with KG-R1's client (`kg_r1/llm_agent/generation.py`): it reads `object`, `success`,
`choices[0].message.content` and `kg_metadata.error_type`, so it sees our typed errors and the
full result list. `success` is false for every non-success status, as KG-R1 reports "no results"
as an error too. Deliberately different: an unknown action or a malformed item is answered per
item (format error) instead of failing the whole batch with 422; an empty batch is `[]` (KG-R1's
server raises on it); messages are ours (they name the problem and what to try next).

Per-item problems the policy caused (unknown function, missing, overlong or non-Unicode entity,
unknown entity or relation, a relation given to a relations-listing call) come back inline as
typed results, so one bad item never fails its batch or another item. Requests that no policy
could have produced (not JSON, too deep, not a list, too many items, too large a body) get a 4xx
with {"error": ...}; the server keeps serving.

`dataset_name` picks a KG by name (case-insensitive). A server with one KG accepts any name
(KG-R1's client always sends one, falling back to "webqsp"). In subgraph mode `sample_id` picks
the question's subgraph; in whole mode it is ignored.

There is no SQL, SPARQL or other query language behind this: entity and relation strings from
the model are dictionary keys into numpy arrays and are never interpolated into code or queries.

In-process mode: `KGService.retrieve(...)` is the function the HTTP route calls (our shape).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ragrl.errors import InputError
from ragrl.http_server import BadBody, HttpLimits, parse_json_body, unencodable_at
from ragrl.http_server import run as run_http

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
    max_body_bytes: int = 4 * 1024 * 1024  # enforced while reading (ragrl.http_server)
    max_field_chars: int = 4096  # longer strings are rejected outright; ops cap arguments far lower


@dataclass(frozen=True)
class KGRequest:
    action_type: str
    dataset_name: str | None = None
    sample_id: str | None = None
    entity_id: str | None = None
    relation: str | None = None
    error: str | None = None  # why this item cannot be run; answered as its own format error


# --------------------------------------------------------------------------- request validation


def parse_batch(body: Any, limits: ServerLimits = ServerLimits()) -> list[KGRequest]:
    """Validate a /retrieve body (a list, or {"requests": list}). Batch-level problems raise
    RequestError; a bad item becomes a KGRequest with `error` set, answered on its own."""
    if isinstance(body, dict):
        if "requests" not in body:
            raise RequestError("a JSON object body needs a 'requests' list; or send the list itself")
        body = body["requests"]
    if not isinstance(body, list):
        raise RequestError(f"request body must be a JSON list of request objects, got {type(body).__name__}")
    if len(body) > limits.max_batch:
        raise RequestError(f"too many requests: {len(body)} > {limits.max_batch} per batch", 413)
    return [_parse_item(i, item, limits) for i, item in enumerate(body)]


def _parse_item(i: int, item: Any, limits: ServerLimits) -> KGRequest:
    if not isinstance(item, dict):
        return _bad_item(f"requests[{i}] must be an object, got {type(item).__name__}")
    values: dict[str, str | None] = {}
    for name in REQUEST_FIELDS:  # unknown fields (KG-R1's "concept", "_debug_batch_idx") are ignored
        value = item.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and name == "sample_id":
            value = str(value)  # numeric question ids are common in KGQA dumps
        if value is not None and not isinstance(value, str):
            return _bad_item(f"requests[{i}].{name} must be a string or null, got {type(value).__name__}")
        if value is not None and len(value) > limits.max_field_chars:
            return _bad_item(f"requests[{i}].{name} has {len(value)} characters, limit {limits.max_field_chars}")
        if value is not None and (at := unencodable_at(value)) is not None:
            return _bad_item(f"requests[{i}].{name} is not valid Unicode (lone surrogate at character {at})")
        values[name] = value
    if values["action_type"] is None:
        return _bad_item(f"requests[{i}].action_type is missing")
    return KGRequest(**values)  # type: ignore[arg-type]


def _bad_item(error: str) -> KGRequest:
    # None of the item's strings is kept: they may be what made it bad (a lone surrogate cannot
    # even be echoed in a UTF-8 response).
    return KGRequest("", error=error)


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
        if len(self.sources) == 1:  # one KG: whatever name the client's data carries means it
            return next(iter(self.sources.values()))
        if dataset_name is None:
            return None
        return self._by_folded.get(dataset_name.casefold())

    def run(self, request: KGRequest) -> OpResult:
        """One item; never raises (a failing lookup is that item's internal error)."""
        try:
            return self._run(request)
        except Exception as exc:  # noqa: BLE001 - one item must not fail the others of its batch
            return OpResult(Status.INTERNAL_ERROR, MESSAGE_PREFIX[Status.INTERNAL_ERROR]
                            + f"the lookup failed ({type(exc).__name__}); this item was not answered.",
                            op=str(request.action_type)[:40])

    def _run(self, request: KGRequest) -> OpResult:
        if request.error is not None:
            return OpResult(Status.FORMAT_ERROR, MESSAGE_PREFIX[Status.FORMAT_ERROR] + request.error + f" Usage: {USAGE}.",
                            op=request.action_type)
        fn = canonical_name(request.action_type)
        if fn is None:
            return execute(_NO_STORE, request.action_type, ())  # the "unknown function" message
        if OPERATIONS[fn].arity == 1 and request.relation:
            # KG-R1's server rejects this too: the model meant get_entities_* (or wrote a wrong call).
            called = request.action_type.strip().lower()
            return OpResult(Status.FORMAT_ERROR, MESSAGE_PREFIX[Status.FORMAT_ERROR] + f"{called} accepts only one "
                            f"entity argument. Usage: {OPERATIONS[fn].usage}; to follow a relation use "
                            f"{OPERATIONS['get_entities_out'].usage} or {OPERATIONS['get_entities_in'].usage}.", op=called)
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
        """A /retrieve body (list or {"requests": list}, or KGRequest objects) -> one result dict per item.

        No batch limit here: it guards the HTTP endpoint against one client's huge body, and an
        in-process caller (the SFT planner asks about every training question at once) is not one."""
        if isinstance(body, list) and body and all(isinstance(b, KGRequest) for b in body):
            requests = body
        else:
            requests = parse_batch(body, replace(self.server_limits, max_batch=sys.maxsize))
        return [self.run(r).to_dict() for r in requests]

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "service": "kg", "datasets": {n: s.info() for n, s in self.sources.items()},
                "operations": list(OPERATIONS), "limits": {**asdict(self.limits), **asdict(self.server_limits)}}

    def actions(self) -> dict[str, Any]:
        """KG-R1's GET /actions listing (its client reads "actions" for its format-error hint)."""
        names = list(OPERATIONS)
        details = {name: {"description": _DESCRIPTIONS[name], "usage": op.usage, "legacy_name": op.legacy,
                          "required_fields": ["dataset_name", "entity_id", *(["relation"] if op.arity == 2 else [])]}
                   for name, op in OPERATIONS.items()}
        return {"actions": names, "supported_actions": names, "supported_kgs": sorted(self.sources),
                "action_details": details}


_DESCRIPTIONS = {
    "get_relations_out": "relations where the entity is the subject (entity -> relation -> ?)",
    "get_relations_in": "relations where the entity is the object (? -> relation -> entity)",
    "get_entities_out": "objects of (entity, relation, ?)",
    "get_entities_in": "subjects of (?, relation, entity)",
}

# KG-R1's `KGErrorType` values (kg_r1/search/error_types.py), which its rewards count per turn.
KG_R1_ERROR_TYPES = {
    Status.SUCCESS: "KG_SUCCESS",
    Status.FORMAT_ERROR: "KG_FORMAT_ERROR",
    Status.ENTITY_NOT_FOUND: "KG_ENTITY_NOT_FOUND",
    Status.RELATION_NOT_FOUND: "KG_RELATION_NOT_FOUND",
    Status.NO_RESULTS: "KG_NO_RESULTS",
    Status.DATASET_NOT_FOUND: "KG_SERVER_ERROR",
    Status.SAMPLE_NOT_FOUND: "KG_SAMPLE_NOT_FOUND",
    Status.INTERNAL_ERROR: "KG_SERVER_ERROR",
}


def with_kg_r1_shape(item: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """Our result dict plus the fields of KG-R1's `kg_retrieval_completion_response`."""
    now = time.time() if now is None else now
    ok = item["status"] == Status.SUCCESS.value
    action = item.get("action_type") or ""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "kg_retrieval",
        "created": int(now),
        "model": "kg-retrieval",
        "success": ok,
        "action": action,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": item["message"]}, "logprobs": None,
                     "finish_reason": "stop" if ok else "error"}],
        "usage": {},
        "system_fingerprint": "",
        "kg_metadata": {"action_type": action, "success": ok,
                        "error_type": KG_R1_ERROR_TYPES.get(Status(item["status"]), "KG_SERVER_ERROR"),
                        "timestamp": now},
        **item,
    }


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
            raise InputError(f"dataset names differ only in case: {sorted(out)}")
        return out
    raise TypeError(f"expected a KGStore, a KGSource or a non-empty mapping of them, got {type(obj).__name__}")


# --------------------------------------------------------------------------- HTTP


def create_app(store_or_stores: KGStore | KGSource | Mapping[str, KGStore | KGSource] | KGService,
               limits: OpLimits = DEFAULT_LIMITS, server_limits: ServerLimits = ServerLimits(),
               http_limits: HttpLimits | None = None) -> FastAPI:
    """The FastAPI app over one store, one source, or a mapping dataset name -> store/source."""
    service = (store_or_stores if isinstance(store_or_stores, KGService)
               else KGService(store_or_stores, limits, server_limits))
    app = FastAPI(title="ragrl KG server")
    app.state.service = service
    app.state.http_limits = http_limits or HttpLimits(max_body_bytes=service.server_limits.max_body_bytes)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {**service.health(), "http_limits": app.state.http_limits.as_dict()}

    @app.get("/actions")
    async def actions() -> dict[str, Any]:
        return service.actions()

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        try:
            requests = parse_batch(parse_json_body(await request.body()), service.server_limits)
        except (BadBody, RequestError) as exc:
            return _error(exc.status, str(exc))
        if not requests:
            return JSONResponse([])
        # Lookups are CPU work (and a subgraph may be built); keep the event loop free for other
        # clients. `run` never raises, so every item gets its own answer.
        results = await run_in_threadpool(service.retrieve, requests)
        now = time.time()
        return JSONResponse([with_kg_r1_shape(r, now) for r in results])

    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "usage": USAGE}, status_code=status)


def kg_dirs(paths: Sequence[str | os.PathLike], names: Sequence[str] = ()) -> dict[str | None, str | os.PathLike]:
    """`--kg` / `--dataset-name` pairs (by position) -> {dataset name or None (= dir name): path}."""
    if not names:
        if len(paths) != 1:
            raise InputError(f"{len(paths)} --kg given: name each with a --dataset-name, in the same order")
        return {None: paths[0]}
    if len(names) != len(paths):
        raise InputError(f"{len(names)} --dataset-name for {len(paths)} --kg; give one name per KG, in the same order")
    if len(set(n.casefold() for n in names)) != len(names):
        raise InputError(f"--dataset-name values must differ (case-insensitively): {list(names)}")
    return dict(zip(names, paths))


def serve(kg_dir: str | os.PathLike | Mapping[str | None, str | os.PathLike], host: str = "127.0.0.1",
          port: int = DEFAULT_PORT, *, mode: str = "whole", limits: OpLimits = DEFAULT_LIMITS,
          server_limits: ServerLimits = ServerLimits(), http_limits: HttpLimits | None = None,
          log_level: str = "info", **load_kwargs: Any) -> None:
    """Load KG(s) and serve until interrupted. `kg_dir` is one directory (see `store.load_kg`) or a
    mapping dataset name (None: the directory's name) -> directory. Binds loopback unless told
    otherwise: there is no authentication."""
    dirs = kg_dir if isinstance(kg_dir, Mapping) else {None: kg_dir}
    sources = {}
    for name, path in dirs.items():
        source = load_kg(Path(path), mode, name=name, **load_kwargs)
        sources[source.name] = source
    app = create_app(sources, limits, server_limits, http_limits)
    run_http(app, app.state.http_limits, host, port, log_level)
