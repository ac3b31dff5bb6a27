"""The terms of AutoGraph-R1's graph rewards that an episode's score is built from: recall of the
supporting passages (R_I), the judge's item and protocol (R_C), the repetition penalty.

In `ragrl.kg`, not `ragrl.rewards`, because the constructor's episodes (`ragrl.kg.constructor`)
score themselves with them while `ragrl.rewards` reads the KG (its environment, operations, graph):
the rewards sit above the KG package. `ragrl.rewards.autograph` re-exports them with its judges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ragrl.kg.extraction import Triple

REPETITION_LIMIT = 0.9  # AutoGraph-R1: a rollout with more than 90% repeated triples scores 0
RECALL_K = 5


def recall_at_k(ranked: Sequence[str], gold: Iterable[str], k: int = RECALL_K) -> float:
    """Share of the distinct gold ids among the first k ranked ids (0 when there is no gold)."""
    gold_set = set(gold)
    if not gold_set or k < 1:
        return 0.0
    return len(gold_set & set(ranked[:k])) / len(gold_set)


def penalised(reward: float, repetition: float, limit: float = REPETITION_LIMIT, weight: float = 1.0) -> float:
    """The task reward minus `weight` x the repetition share; 0 when the share exceeds `limit`."""
    return 0.0 if repetition > limit else reward - weight * repetition


@dataclass(frozen=True)
class JudgeItem:
    question: str
    answers: tuple[str, ...]  # gold answer and aliases
    triples: tuple[Triple, ...]  # what the subgraph retriever returned


class Judge(Protocol):
    def judge(self, items: Sequence[JudgeItem]) -> list[bool]: ...
