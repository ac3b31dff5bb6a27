"""A perfect agent's plan for one QA row, and the planner that writes its turns.

Here, below both `ragrl.train.sft_data` (which turns plans into SFT sequences) and the synthetic
world's planner (`ragrl.toy.gold`), because `ragrl.train` also imports `ragrl.toy` (pretraining
the tiny model): with the plan types in `train`, the two packages imported each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Hop:
    head: str
    relation: str
    tail: str
    query: str
    passage: str | None  # the supporting passage id, when known


@dataclass(frozen=True)
class GoldPlan:
    """What a perfect agent does for one row: search turns (each a list of hop indices), then answer."""

    row_id: str
    question: str
    answer: str
    hops: tuple[Hop, ...]
    turns: tuple[tuple[int, ...], ...]


class GoldPlanner(Protocol):
    """Turns a QA row into a perfect agent's plan and writes its turns (the synthetic world's is
    `ragrl.toy.gold.WorldPlanner`; real datasets have no such annotations)."""

    def plan(self, row: dict, multi_query: bool, max_queries: int) -> GoldPlan: ...

    def search_text(self, plan: GoldPlan, turn: int) -> str: ...

    def answer_text(self, plan: GoldPlan) -> str: ...
