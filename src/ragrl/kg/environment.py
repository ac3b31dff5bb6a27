"""KG-R1's environment: `<kg-query>fn("entity", "relation")</kg-query>` or `<answer>…</answer>`.

Implements the agent `Environment` protocol (`name`, `spec`, `parse`, `respond`,
`last_search_s`), so the unchanged `RolloutEngine` drives it. `protocol.parse_action` already
knows the kg-query action (`ActionSpec(actions=("kg-query", "answer"))` gives
`Action("kg-query", queries=(content,))`); this environment adds the function-call parse: a
malformed call becomes an invalid action whose error names the problem.

All queries of one turn go to the backend in ONE `retrieve` call. A backend is anything with
`retrieve(list[dict]) -> list[dict]` in KG-R1's request shape: `KGClient` (HTTP) or `KGService`
(in-process). Results that mean the pipeline is misconfigured (unknown dataset or sample) raise
`KGBackendError` instead of being shown to the model, as retrieval failures do in the search
environments.

Subgraph mode needs the question each trajectory belongs to: the rollout engine passes it per
action (`respond(..., sample_ids=...)`); an environment bound to one question (`sample_id`, or
`for_sample(...)`, for callers outside the engine) uses its own when an action comes without one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from ragrl.agent.protocol import Action, ActionSpec, invalid_message, parse_action, sanitize
from ragrl.kg.ops import BACKEND_ERRORS
from ragrl.kg.query_parser import KGQuery, QueryFormatError, parse_query

KG_SPEC = ActionSpec(actions=("kg-query", "answer"))

DEFAULT_KG_INSTRUCTION = (
    "Answer the given question. You can query a knowledge graph. Reason step by step inside <think> and "
    "</think> every time you get new information. To query, write exactly one of these inside <kg-query> and "
    "</kg-query>:\n"
    "- get_relations_out(\"entity\"): relations where the entity is the subject\n"
    "- get_relations_in(\"entity\"): relations where the entity is the object\n"
    "- get_entities_out(\"entity\", \"relation\"): objects of (entity, relation, ?)\n"
    "- get_entities_in(\"entity\", \"relation\"): subjects of (?, relation, entity)\n"
    "Results appear between <information> and </information>. When you know the answer, give it inside "
    "<answer> and </answer>, several entities separated by |, for example <answer> Beijing </answer>. "
    "Question: {question}\n"
)


@runtime_checkable
class KGBackend(Protocol):
    def retrieve(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]: ...


class KGBackendError(RuntimeError):
    """The backend answered with results that mean a misconfigured pipeline, or malformed ones."""


class KGEnvironment:
    name = "kg"
    # The rollout engine's default prompt for this environment (RolloutConfig.instruction overrides).
    instruction = DEFAULT_KG_INSTRUCTION

    def __init__(self, backend: KGBackend, dataset_name: str | None = None, sample_id: str | None = None) -> None:
        self.backend = backend
        # None: the backend's own (a KGClient's --kg-dataset); an in-process KG accepts any
        self.dataset_name = dataset_name if dataset_name is not None else getattr(backend, "dataset_name", None)
        self.sample_id = sample_id
        self.spec = KG_SPEC
        self.last_search_s = 0.0  # wall time of the latest backend call (0 when none was needed)

    def for_sample(self, sample_id: str | None, dataset_name: str | None = None) -> KGEnvironment:
        """The same backend bound to one question (subgraph mode with the unchanged rollout engine)."""
        return KGEnvironment(self.backend, dataset_name or self.dataset_name, sample_id)

    def parse(self, text: str) -> Action:
        action = parse_action(text, self.spec)
        if action.kind != "kg-query":
            return action
        query = parse_query(action.queries[0])
        if isinstance(query, QueryFormatError):
            return Action("invalid", error=query.message, overshoot=action.overshoot)
        return action

    def respond(self, actions: Sequence[Action], reserved: Iterable[str] = (),
                sample_ids: Sequence[str | None] | None = None) -> list[str | None]:
        """Observation text (without the <information> tags) per action; None for answers."""
        reserved = tuple(reserved)
        if sample_ids is not None and len(sample_ids) != len(actions):
            raise ValueError(f"{len(sample_ids)} sample ids for {len(actions)} actions")
        out: list[str | None] = [None] * len(actions)
        pending: list[tuple[int, dict[str, Any]]] = []
        for i, action in enumerate(actions):
            if action.kind == "answer":
                continue
            if action.kind != "kg-query":
                error = action.error if action.kind == "invalid" else f"<{action.kind}> is not available here."
                # Only the error (which may quote the model) is defused; the hint's tags are meant literally.
                out[i] = invalid_message(sanitize(error or "", reserved), self.spec)
                continue
            query = parse_query(action.queries[0]) if action.queries else QueryFormatError("empty query.")
            if isinstance(query, QueryFormatError):  # actions parsed by someone else's parse()
                out[i] = invalid_message(sanitize(query.message, reserved), self.spec)
                continue
            sample = sample_ids[i] if sample_ids is not None and sample_ids[i] is not None else self.sample_id
            pending.append((i, query.to_request(self.dataset_name, sample)))
        if pending:
            results = self._retrieve([r for _, r in pending])
            for (i, _), result in zip(pending, results):
                out[i] = sanitize(result["message"], reserved)
        return out

    def query_for(self, action: Action) -> KGQuery | None:
        """The parsed call of a kg-query action (for logging and rewards)."""
        if action.kind != "kg-query" or not action.queries:
            return None
        query = parse_query(action.queries[0])
        return query if isinstance(query, KGQuery) else None

    def _retrieve(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        start = time.monotonic()
        try:
            results = self.backend.retrieve(requests)
        except Exception as exc:
            exc.add_note(f"while the kg environment sent {len(requests)} queries (first: {requests[0]!r}); the "
                         "rollout stops here instead of feeding the policy empty observations")
            raise
        finally:
            self.last_search_s = time.monotonic() - start
        if not isinstance(results, list) or len(results) != len(requests):
            got = len(results) if isinstance(results, list) else type(results).__name__
            raise KGBackendError(f"KG backend returned {got} results for {len(requests)} queries")
        for request, result in zip(requests, results):
            if not isinstance(result, dict) or not isinstance(result.get("message"), str):
                raise KGBackendError(f"KG backend result for {request!r} has no 'message': {str(result)[:200]}")
            if result.get("status") in {s.value for s in BACKEND_ERRORS}:
                raise KGBackendError(f"KG backend cannot serve {request!r}: {result['message']}")
        return results


__all__ = ["DEFAULT_KG_INSTRUCTION", "KG_SPEC", "KGBackend", "KGBackendError", "KGEnvironment"]
