"""Adapt `ragrl.retrieval` backends (in-process `Searcher`, HTTP `RetrievalClient`) to the agent's
`Retriever` protocol, whose hits are plain mappings.

The retrieval side returns frozen `Hit` dataclasses (cheap, typed, no torch import on the client);
the environments format and validate mappings (`hit["text"]`), so that fakes in tests and other
backends need not know about `Hit`. This adapter is the one place where the two meet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class HitBackend(Protocol):
    def search(self, queries: Sequence[str], topk: int) -> Sequence[Sequence[Any]]: ...


class AgentRetriever:
    """`search(queries, topk) -> list[list[dict]]` over any backend that returns `Hit`s or mappings."""

    def __init__(self, backend: HitBackend) -> None:
        self.backend = backend

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        return [[hit_to_dict(h) for h in hits] for hits in self.backend.search(list(queries), topk)]

    @property
    def per_question(self) -> bool:
        """Whether the backend answers a query from its question (an oracle): see `search_for`."""
        return callable(getattr(self.backend, "search_for", None))

    def search_for(self, queries: list[str], topk: int, sample_ids: list[str | None]) -> list[list[dict]]:
        search_for = getattr(self.backend, "search_for")  # present: see per_question
        return [[hit_to_dict(h) for h in hits] for hits in search_for(list(queries), topk, sample_ids)]


def hit_to_dict(hit: Any) -> dict:
    if isinstance(hit, Mapping):
        return dict(hit)
    to_dict = getattr(hit, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"cannot turn a {type(hit).__name__} into a retrieval hit mapping")
    return to_dict()
