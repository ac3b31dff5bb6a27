"""Knowledge graphs for KG-R1: store, the four one-hop operations, query parser, server, client, environment.

    load_kg(dir, mode)            triples parquet or "simple" KGQA dir -> KGSource (whole KG or per-question subgraphs)
    KGStore                       integer triples, CSR adjacency both ways, name lookup
    get_relations_out/in, get_entities_out/in (+ legacy get_tail/head_*)   typed `OpResult`s
    parse_query(text)             `<kg-query>` content -> KGQuery | QueryFormatError (never raises)
    KGService / create_app / serve   KG-R1-compatible POST /retrieve, in process or over HTTP
    KGClient(url)                 the HTTP side
    KGEnvironment(backend)        the agent Environment for <kg-query>/<answer> turns

Submodules are imported lazily: a trainer that only parses queries need not import FastAPI.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KGStore": "store",
    "KGSource": "store",
    "SimpleKGQA": "store",
    "load_kg": "store",
    "load_triples_parquet": "store",
    "Status": "ops",
    "OpResult": "ops",
    "OpLimits": "ops",
    "OPERATIONS": "ops",
    "execute": "ops",
    "get_relations_out": "ops",
    "get_relations_in": "ops",
    "get_entities_out": "ops",
    "get_entities_in": "ops",
    "get_tail_relations": "ops",
    "get_head_relations": "ops",
    "get_tail_entities": "ops",
    "get_head_entities": "ops",
    "status_of_message": "ops",
    "KGQuery": "query_parser",
    "QueryFormatError": "query_parser",
    "parse_query": "query_parser",
    "KGService": "server",
    "create_app": "server",
    "serve": "server",
    "KGClient": "client",
    "KGServiceError": "client",
    "KGServiceUnavailable": "client",
    "KGEnvironment": "environment",
    "KGBackendError": "environment",
    "KG_SPEC": "environment",
    "DEFAULT_KG_INSTRUCTION": "environment",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
