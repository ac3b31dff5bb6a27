"""Search environments: turn parsed actions into observation text, one retriever call per turn.

An environment is batched by construction: `respond` receives the actions of every active
trajectory of one turn and sends all their queries to the retriever in a single `search` call,
because a retrieval server (dense index on a GPU, BM25 over a large corpus) amortises well over a
batch and badly over hundreds of one-query requests.

Retrieval failures are not the environment's to hide. A retriever exception propagates, with a
note saying what was being searched; a malformed result raises `RetrievalResultError`. Turning
either into empty observations would give every trajectory a silent zero reward and an RL run
that "trains" on nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ragrl.agent.protocol import (
    Action,
    ActionSpec,
    DEFAULT_QUERY_SEPARATORS,
    RAG_R1_MULTI_QUERY_INSTRUCTION,
    dropped_note,
    format_docs,
    format_multi_docs,
    format_rag_r1_json,
    invalid_message,
    parse_action,
    rag_r1_documents,
    rag_r1_header_ends,
    rag_r1_json,
    sanitize,
)
from ragrl.errors import InputError


@runtime_checkable
class Retriever(Protocol):
    """Anything with a batched search; each hit is a mapping with `id`, `title`, `text` (and maybe `score`)."""

    def search(self, queries: list[str], topk: int) -> list[list[dict]]: ...


class Environment(Protocol):
    """What the rollout engine needs from an environment (KG environments implement the same)."""

    name: str
    spec: ActionSpec
    last_search_s: float  # wall time of the latest backend call, attributed to the turn's searchers

    def parse(self, text: str) -> Action: ...

    def respond(self, actions: Sequence[Action], reserved: Iterable[str] = (),
                sample_ids: Sequence[str | None] | None = None) -> list[str | None]: ...
    # sample_ids: the question id of each action's trajectory, for environments that answer per
    # question (the KG's subgraph mode); environments that do not need it ignore it.


class RetrievalResultError(ValueError):
    """The retriever answered, but not with one list of documents per query."""


class SearchEnvironment:
    """Search-R1: one `<search>query</search>` per turn, or `<answer>…</answer>`."""

    name = "search"

    def __init__(self, retriever: Retriever, topk: int = 3) -> None:
        if topk < 1:
            raise InputError(f"topk={topk} must be >= 1")
        self.retriever = retriever
        self.topk = topk
        self.spec = self._make_spec()
        self.last_search_s = 0.0  # wall time of the latest retriever call (0 when none was needed)
        # per action of the latest respond, per query: the hits its observation showed
        self.last_shown: list[list[list[dict]]] = []

    @property
    def last_hits(self) -> list[list[tuple[str, str, int]]]:
        """Per action of the latest respond: (id, title, rank in its query's list) of each passage
        shown, for the turn record (a retrieval reward reads what the environment returned, never
        the policy's text)."""
        return [[(str(h.get("id", "")), str(h.get("title") or ""), rank) for per_query in shown
                 for rank, h in enumerate(per_query, 1)] for shown in self.last_shown]

    def _make_spec(self) -> ActionSpec:
        return ActionSpec(actions=("search", "answer"))

    def parse(self, text: str) -> Action:
        return parse_action(text, self.spec)

    def respond(self, actions: Sequence[Action], reserved: Iterable[str] = (),
                sample_ids: Sequence[str | None] | None = None) -> list[str | None]:
        """Information text (without the <information> tags) per action; None for answers.

        Invalid actions get an explanation; searches get their documents. All queries of all
        actions go out in one retriever call.
        """
        reserved = tuple(reserved)
        queries = [q for a in actions if a.kind == "search" for q in a.queries]
        ids = list(sample_ids) if sample_ids is not None else [None] * len(actions)
        query_ids = [sid for a, sid in zip(actions, ids) if a.kind == "search" for _ in a.queries]
        results = self._search(queries, query_ids) if queries else []
        out: list[str | None] = []
        self.last_shown = []
        cursor = 0
        for action in actions:
            shown: list[list[dict]] = []
            if action.kind == "answer":
                out.append(None)
            elif action.kind == "search":
                hits = results[cursor : cursor + len(action.queries)]
                cursor += len(action.queries)
                text, shown = self._render(action, hits, reserved)
                out.append(text)
            else:
                out.append(invalid_message(action.error if action.kind == "invalid" else
                                           f"<{action.kind}> is not available here.", self.spec, reserved))
            self.last_shown.append(shown)
        return out

    def _render(self, action: Action, hits: list[list[dict]],
                reserved: tuple[str, ...]) -> tuple[str, list[list[dict]]]:
        """The observation text of a search, and the hits it shows (per query, in rank order)."""
        return format_docs(hits[0], reserved), hits

    def _search(self, queries: list[str], sample_ids: list[str | None] | None = None) -> list[list[dict]]:
        start = time.monotonic()
        try:
            # An oracle retriever answers from each query's question; any other from the query alone.
            if getattr(self.retriever, "per_question", False) and sample_ids is not None:
                results = getattr(self.retriever, "search_for")(list(queries), self.topk, sample_ids)
            else:
                results = self.retriever.search(list(queries), self.topk)
        except Exception as exc:
            exc.add_note(
                f"while the {self.name} environment searched {len(queries)} queries (first: {queries[0]!r}); "
                "the rollout stops here instead of feeding the policy empty observations"
            )
            raise
        finally:
            self.last_search_s = time.monotonic() - start
        return _checked(results, queries, self.topk)


@dataclass(frozen=True)
class MultiQueryFormat:
    """How a multi-query turn is written and answered: query separators inside one <search>, the
    observation layout ("grouped": a `Query i:` header per query; "json": RAG-R1's JSON object),
    and the default prompt that tells the model so (None: the engine's default)."""

    separators: tuple[str, ...]
    observation: str
    instruction: str | None = None

    def __post_init__(self) -> None:
        if self.observation not in OBSERVATION_LAYOUTS:
            raise InputError(f"observation must be one of {OBSERVATION_LAYOUTS}, got {self.observation!r}")
        if not self.separators or not all(isinstance(s, str) and s for s in self.separators):
            raise InputError(f"separators must be non-empty strings, got {self.separators!r}")


OBSERVATION_LAYOUTS = ("grouped", "json")
MULTI_QUERY_FORMATS: dict[str, MultiQueryFormat] = {
    # Ours (the default): "|" or newlines between queries, results grouped under each query.
    "ragrl": MultiQueryFormat(DEFAULT_QUERY_SEPARATORS, "grouped"),
    # RAG-R1 (inclusionAI, rag_r1/llm_agent/generation_mq.py): `<search>q1, q2</search>`, answered
    # with json.dumps({"query": [...], "documents": [...]}, indent=2).
    "rag_r1": MultiQueryFormat((",",), "json", RAG_R1_MULTI_QUERY_INSTRUCTION),
}


def multi_query_format(preset: str = "ragrl", separators: Sequence[str] | None = None,
                       observation: str | None = None) -> MultiQueryFormat:
    """A named preset, with `separators` / `observation` overriding its values when given."""
    if preset not in MULTI_QUERY_FORMATS:
        raise InputError(f"unknown multi-query format {preset!r}; expected one of {sorted(MULTI_QUERY_FORMATS)}")
    base = MULTI_QUERY_FORMATS[preset]
    return MultiQueryFormat(tuple(separators) if separators is not None else base.separators,
                            observation or base.observation, base.instruction)


class MultiQuerySearchEnvironment(SearchEnvironment):
    """RAG-R1: up to `max_queries` queries per turn, `<search>q1 | q2</search>` (or one per line, or
    adjacent `<search>` blocks); extra queries are dropped and the observation says which.
    `query_format` picks the separators and the observation layout (`MULTI_QUERY_FORMATS`;
    "rag_r1" is RAG-R1's own: commas, JSON)."""

    name = "multi_query_search"

    def __init__(self, retriever: Retriever, topk: int = 3, max_queries: int = 3,
                 separators: Sequence[str] | None = None, *, query_format: str | MultiQueryFormat = "ragrl",
                 observation: str | None = None, query_obs_tokens: int | None = None) -> None:
        self.max_queries = max_queries
        self.format = (query_format if isinstance(query_format, MultiQueryFormat)
                       else multi_query_format(query_format, separators, observation))
        self.separators = self.format.separators
        # Read by RolloutEngine.prompt_ids when no instruction is configured.
        self.instruction = self.format.instruction
        if query_obs_tokens is not None and (query_obs_tokens < 1 or self.format.observation != "json"):
            raise InputError(f"query_obs_tokens={query_obs_tokens}: a positive token budget, for the 'json' "
                             f"observation layout only (this one is {self.format.observation!r})")
        self.query_obs_tokens = query_obs_tokens
        self._tokenizer: Any = None
        super().__init__(retriever, topk)

    def use_tokenizer(self, tokenizer) -> None:
        """The policy's tokenizer, for `query_obs_tokens` (RolloutEngine hands over its own)."""
        self._tokenizer = tokenizer

    def _make_spec(self) -> ActionSpec:
        return ActionSpec(actions=("search", "answer"), multi_query=True, max_queries=self.max_queries,
                          separators=self.separators)

    def _render(self, action: Action, hits: list[list[dict]],
                reserved: tuple[str, ...]) -> tuple[str, list[list[dict]]]:
        # The note goes first: a long observation is truncated from the end. The dropped queries are
        # the model's text, defused like the kept ones ("<|im_end|>" survives a "," separator).
        note = dropped_note([sanitize(q, reserved) for q in action.dropped], self.max_queries)
        if self.format.observation != "json":
            return note + format_multi_docs(action.queries, hits, reserved), hits
        if self.query_obs_tokens is None:
            return note + format_rag_r1_json(action.queries, hits, reserved), hits
        # RAG-R1 cuts each query's documents to max_obs_length tokens and never the whole JSON
        # (generation_mq.py `_process_documents`): a third query keeps its passages however long
        # the first two's are. A passage cut before the end of its title line was not shown.
        documents, shown = [], []
        for per_query in hits:
            full = rag_r1_documents(per_query, reserved)
            kept = self._cut_tokens(full, self.query_obs_tokens)
            documents.append(kept)
            shown.append([h for h, end in zip(per_query, rag_r1_header_ends(per_query, reserved), strict=True)
                          if kept == full or self._tokens(full[:end]) <= self.query_obs_tokens])
        return note + rag_r1_json(action.queries, documents, reserved), shown

    def _tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def _cut_tokens(self, text: str, budget: int) -> str:
        if self._tokenizer is None:
            raise InputError("query_obs_tokens needs the policy's tokenizer: build a RolloutEngine over this "
                             "environment (it hands over its own) before it answers")
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return text if len(ids) <= budget else self._tokenizer.decode(ids[:budget], skip_special_tokens=True)


class ClosedBookEnvironment:
    """Only <answer>: the no-retrieval baseline. Any other action is invalid (and not executed)."""

    name = "none"

    def __init__(self) -> None:
        self.spec = ActionSpec(actions=("answer",))
        self.last_search_s = 0.0

    def parse(self, text: str) -> Action:
        return parse_action(text, self.spec)

    def respond(self, actions: Sequence[Action], reserved: Iterable[str] = (),
                sample_ids: Sequence[str | None] | None = None) -> list[str | None]:
        reserved = tuple(reserved)
        return [None if a.kind == "answer" else
                invalid_message(a.error or f"<{a.kind}> is not available here.", self.spec, reserved)
                for a in actions]



def _checked(results, queries: list[str], topk: int) -> list[list[dict]]:
    if not isinstance(results, Sequence) or isinstance(results, (str, bytes)) or len(results) != len(queries):
        got = len(results) if isinstance(results, Sequence) else type(results).__name__
        raise RetrievalResultError(f"retriever returned {got} result lists for {len(queries)} queries")
    checked = []
    for qi, hits in enumerate(results):
        if not isinstance(hits, Sequence) or isinstance(hits, (str, bytes)):
            raise RetrievalResultError(
                f"result {qi} for query {queries[qi]!r} is a {type(hits).__name__}, not a list of documents"
            )
        for hi, hit in enumerate(hits):
            if not isinstance(hit, Mapping) or not isinstance(hit.get("text"), str):
                raise RetrievalResultError(
                    f"hit {hi} for query {queries[qi]!r} has no 'text' string (got {type(hit).__name__}: {str(hit)[:120]})"
                )
        checked.append(list(hits)[:topk])
    return checked
