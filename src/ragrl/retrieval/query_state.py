"""The text a retriever policy encodes at one retrieval step: HARR's history-aware state.

HARR (arXiv 2602.03645) fights state aliasing in multi-hop retrieval (the same sub-query means
different things in different questions) by encoding, at every step, the original question, the
completed hops and the current query as one string. The formats below are the authors' own, byte
for byte (github.com/zyc140345/HARR at 50cfd09):

- `llama_index_hacked/tool.py::build_stateful_embedding_query`:
      "Original Question: {question}\\nHistory: {json.dumps(history, ensure_ascii=False)}\\nQuery: {query}"
  and, without history (their `--enable_stateful` off, the paper's ablation), "Query: {query}".
- `prompt.py`: STATEFUL_RETRIEVAL_INSTRUCTION / RETRIEVAL_INSTRUCTION.
- `llama_index_hacked/model.py`: Qwen3-Embedding's query prompt "Instruct: {instruction}\\n{query}";
  documents are embedded with no prompt.

A history entry is one completed hop. Their ReAct tool records {"sub_query", "status", "answer"}
(the QA module's FOUND / NOT_FOUND / AMBIGUOUS verdict and its answer); their Search-R1 loop records
{"sub_query", "answer"} with the agent's <think> text as "answer" (null when it had none). Keys keep
that order, and a hop without a status simply has no "status" key.

Standard library only: the workflow may build these strings without importing torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ragrl.errors import InputError

STATEFUL_RETRIEVAL_INSTRUCTION = (
    "Given an Original Question that requires multi-hop retrieval and the History (i.e., the completed hops), "
    "retrieve relevant passages for the Query (i.e., the current hop) that help answer the Original Question."
)
RETRIEVAL_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# Qwen3-Embedding's query prompt. A model trained without instructions (all-MiniLM-L6-v2) takes
# "{state}" instead: the recipe says which.
INSTRUCT_TEMPLATE = "Instruct: {instruction}\n{state}"


@dataclass(frozen=True)
class Hop:
    """One completed retrieval step as the history shows it."""

    sub_query: str | None
    answer: str | None
    status: str | None = None  # None: the pipeline has no per-hop verdict (Search-R1)

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"sub_query": self.sub_query}
        if self.status is not None:
            entry["status"] = self.status
        entry["answer"] = self.answer
        return entry


def _entry(hop: Hop | Mapping[str, Any]) -> Mapping[str, Any]:
    return hop.to_json() if isinstance(hop, Hop) else hop


def history_state(question: str, history: Sequence[Hop | Mapping[str, Any]], query: str) -> str:
    """HARR's stateful query: the original question, the completed hops as JSON, the current query."""
    hops = json.dumps([_entry(h) for h in history], ensure_ascii=False)
    return f"Original Question: {question}\nHistory: {hops}\nQuery: {query}"


def query_only_state(query: str) -> str:
    """The ablation without history: the current query alone."""
    return f"Query: {query}"


def retrieval_state(question: str, history: Sequence[Hop | Mapping[str, Any]], query: str, *,
                    use_history: bool) -> str:
    return history_state(question, history, query) if use_history else query_only_state(query)


def default_instruction(use_history: bool) -> str:
    """The instruction the authors pair with each state (the stateful one only with history)."""
    return STATEFUL_RETRIEVAL_INSTRUCTION if use_history else RETRIEVAL_INSTRUCTION


def encoder_input(state: str, instruction: str, template: str = INSTRUCT_TEMPLATE) -> str:
    """The string the query encoder sees: `template` filled with the instruction and the state.

    Plain str.replace rather than str.format: a question or a hop may contain braces.
    """
    if "{state}" not in template:
        raise InputError(f"query template {template!r} has no {{state}} placeholder: the encoder would never "
                         "see the query")
    return template.replace("{instruction}", instruction).replace("{state}", state)
