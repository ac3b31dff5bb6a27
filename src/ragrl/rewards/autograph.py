"""AutoGraph-R1's rewards for a KG constructor, as pure functions plus pluggable judges.

- R_I ("graph as knowledge index"): recall of the gold supporting passages in the PPR retriever's
  top 5 (`recall_at_k`).
- R_C ("graph as knowledge carrier"): 1 when a judge says the gold answer can be deduced from the
  triples the subgraph retriever returned, else 0. A judge is anything with
  `judge(items) -> list[bool]` (batched: one call per training batch). Two here:
  `ConnectivityJudge`, deterministic, for the embedded default (a deviation: the authors ask a
  frozen LLM), and `OpenAIJudge`, an LLM behind an OpenAI-compatible chat endpoint with the
  authors' prompt (files under `ragrl/kg/prompts/`, not code).
- Both subtract the share of repeated triples, and a rollout whose share exceeds 0.9 gets 0
  (`penalised`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources

from ragrl.errors import RagrlError

# The terms an episode's score is made of live in ragrl.kg.graph_scoring, beside the episodes
# (ragrl.kg.constructor) that use them: here they made ragrl.kg and ragrl.rewards import each other.
from ragrl.kg.graph_scoring import (  # noqa: F401  (re-exported)
    RECALL_K,
    REPETITION_LIMIT,
    Judge,
    JudgeItem,
    penalised,
    recall_at_k,
)
from ragrl.kg.text_graph import build_graph, name_matches, subgraph_triples
from ragrl.replies import DEAD_RUN, ReplyTally


class ConnectivityJudge:
    """A deterministic stand-in for the LLM judge on the embedded default (a deviation: the authors
    ask a frozen LLM). Yes when a gold answer (or alias) names an entity of the retrieved triples
    that a path in those triples joins to an entity the question names. When the question names
    the answer itself (the world's comparison questions: "who was born first, X or Y?"), it is a
    choice between named entities: yes when at least two of them have a retrieved triple (the judge
    sees only the triples, so a named entity without any is invisible to it). It cannot tell a relevant path from an irrelevant one, which an LLM can."""

    def judge(self, items: Sequence[JudgeItem]) -> list[bool]:
        return [connected_answer(item) for item in items]


def connected_answer(item: JudgeItem) -> bool:
    graph = build_graph([("retrieved", item.triples)])
    starts = name_matches(graph, item.question)
    targets = {e for a in item.answers if (e := graph.entity_id(a)) is not None}
    if not starts or not targets:
        return False
    if targets & set(starts):
        return len(starts) >= 2  # every start is a node of some retrieved triple
    walked = subgraph_triples(graph, starts, hops=len(graph.entities))  # everything connected to a start
    return bool(targets & {int(n) for t in walked for n in (graph.heads[t], graph.tails[t])})


_PLACEHOLDER = re.compile(r"\{(triples|question|answer)\}")


def judge_prompt(item: JudgeItem, system: str | None = None, user: str | None = None) -> list[dict[str, str]]:
    """The authors' verify-answer messages (deduce_answer in their subgraph retriever)."""
    system = system if system is not None else _prompt("autograph_judge_system.txt")
    user = user if user is not None else _prompt("autograph_judge_user.txt")
    facts = ". ".join(f"({t.subject}-{t.relation}->{t.object})" for t in item.triples) or "No relevant triples found."
    # One pass over the template only: the facts are model text, and a triple that spells
    # "{answer}" must reach the judge as written, not as the gold answer (a forged yes).
    values = {"triples": facts, "question": item.question, "answer": item.answers[0] if item.answers else ""}
    content = _PLACEHOLDER.sub(lambda m: values[m[1]], user)
    return [{"role": "system", "content": system.strip()}, {"role": "user", "content": content.strip()}]


def _prompt(name: str) -> str:
    return resources.files("ragrl.kg").joinpath("prompts", name).read_text(encoding="utf-8")


def read_verdict(text: object) -> bool:
    """The authors' reading of the judge's reply: "yes" anywhere means yes."""
    return isinstance(text, str) and "yes" in text.strip().lower()


def verdict_stated(text: str) -> bool:
    """Whether a reply says yes or no at all (else the authors' reading makes it a silent no)."""
    return read_verdict(text) or re.search(r"\bno\b", text.lower()) is not None


class JudgeError(RagrlError, RuntimeError):
    """The judge endpoint failed or answered something that is not a chat completion."""


class OpenAIJudge:
    """An LLM judge behind an OpenAI-compatible `/v1/chat/completions` endpoint (vLLM, SGLang).

    Requests of one batch go out concurrently; a failure raises `JudgeError` (a silent "no"
    would train the constructor against a broken judge). So does a reply without text, after
    `retries`; a reply saying neither yes nor no is read as no, as the authors do, and counted
    (`replies`, logged), and `dead_run` of them in a row raise (ragrl.replies; None: never, for a
    measurement that wants every reply)."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 120.0,
                 max_tokens: int = 8, concurrency: int = 8, retries: int = 2, system_prompt: str | None = None,
                 user_prompt: str | None = None, dead_run: int | None = DEAD_RUN) -> None:
        import httpx

        from ragrl.http_retry import api_url

        self.url = api_url(base_url, "chat/completions")
        self.model = model
        self.max_tokens = max_tokens
        self.concurrency = max(1, concurrency)
        self.retries = retries
        self.system_prompt = system_prompt
        self.user_prompt = user_prompt
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers)
        self.replies = ReplyTally("judge", self.url, JudgeError, "no", dead_run)

    def close(self) -> None:
        self._http.close()

    def judge(self, items: Sequence[JudgeItem]) -> list[bool]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.concurrency) as pool:
            texts = list(pool.map(self._one, items))
        self.replies.record([verdict_stated(t) for t in texts])
        return [read_verdict(t) for t in texts]

    def _one(self, item: JudgeItem) -> str:
        from ragrl.replies import chat_text

        body = {"model": self.model, "messages": judge_prompt(item, self.system_prompt, self.user_prompt),
                "temperature": 0.0, "max_tokens": self.max_tokens}
        return chat_text(self._http, self.url, body, retries=self.retries, backoff=0.5, max_backoff=8.0,
                         rejected=JudgeError, unavailable=JudgeError, service="judge")


__all__ = ["ConnectivityJudge", "Judge", "JudgeError", "JudgeItem", "OpenAIJudge", "REPETITION_LIMIT", "RECALL_K",
           "connected_answer", "judge_prompt", "penalised", "read_verdict", "recall_at_k", "verdict_stated"]
