"""What both fact-scoring backends share: the score, the KB lookup, the caches."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

GAMMA = 10  # KnowRL's length-penalty horizon (fact_reward.py: get_score(gamma=10))
TOPIC_SEPARATOR = ";"  # KnowRL's RL data names several KB titles per question, joined by ';'


@dataclass(frozen=True)
class FactVerdict:
    fact: str
    supported: bool
    evidence: str | None = None  # the KB statement or passage that supports it


@dataclass(frozen=True)
class FactScore:
    """One text's factuality: `score` = precision × length penalty (0 with no facts), KnowRL's
    `FactScorer.get_score(gamma=10, count_supported=False)`."""

    topic: str
    verdicts: tuple[FactVerdict, ...] = ()
    missing_topic: bool = False
    gamma: int = GAMMA

    @property
    def n_facts(self) -> int:
        return len(self.verdicts)

    @property
    def n_supported(self) -> int:
        return sum(v.supported for v in self.verdicts)

    @property
    def precision(self) -> float:
        return self.n_supported / self.n_facts if self.verdicts else 0.0

    @property
    def penalty(self) -> float:
        return length_penalty(self.n_facts, self.gamma)

    @property
    def score(self) -> float:
        return self.precision * self.penalty

    def to_dict(self) -> dict:
        return {"topic": self.topic, "score": self.score, "precision": self.precision, "penalty": self.penalty,
                "n_facts": self.n_facts, "n_supported": self.n_supported, "missing_topic": self.missing_topic,
                "facts": [{"fact": v.fact, "supported": v.supported, "evidence": v.evidence} for v in self.verdicts]}


def length_penalty(n_facts: int, gamma: int = GAMMA) -> float:
    """1 above `gamma` facts, else exp(1 − gamma / n): few facts earn little; 0 with no facts."""
    if n_facts <= 0:
        return 0.0
    return 1.0 if n_facts > gamma else math.exp(1.0 - gamma / n_facts)


@dataclass
class KnowledgeBase:
    """Passages per topic from a KnowRL SQLite KB, read once per topic. A topic may name several
    titles joined by ';' (KnowRL's RL data): the passages of every title found are used."""

    path: str | os.PathLike
    _cache: dict[str, list[tuple[str, str]] | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Checked when a job opens it, so a damaged or wrong file is named before any scoring.
        from ragrl.kb import validate_kb

        validate_kb(self.path)

    def passages(self, topic: str) -> list[tuple[str, str]] | None:
        """[(title, passage)] of the topic, or None when no title of it is in the KB."""
        if topic not in self._cache:
            from ragrl.kb import read_document

            found: list[tuple[str, str]] = []
            titles = [t.strip() for t in topic.split(TOPIC_SEPARATOR)] if TOPIC_SEPARATOR in topic else [topic]
            for title in dict.fromkeys(t for t in titles if t):
                found += [(title, p) for p in read_document(self.path, title) or []]
            self._cache[topic] = found or None
        return self._cache[topic]


class FactScorer:
    """Scores (topic, text) pairs against a KB; backends supply `extract` and `verify`.

    extract(texts) -> list of atomic-fact lists (one per text; may call a model in one batch)
    verify(topic, facts, passages) -> list of FactVerdict (only facts not verified before)
    """

    def __init__(self, kb: str | os.PathLike | KnowledgeBase, gamma: int = GAMMA, log=None) -> None:
        self.kb = kb if isinstance(kb, KnowledgeBase) else KnowledgeBase(kb)
        self.gamma = gamma
        self.log = log or sys.stderr
        self.fact_cache: dict[str, list[str]] = {}
        self.verdict_cache: dict[tuple[str, str], FactVerdict] = {}
        self.missing_topics: set[str] = set()
        self.calls = {"extract": 0, "verify": 0}  # texts / facts sent to the backend (cache misses)

    @property
    def offformat(self) -> dict[str, int]:
        """Replies of the backend's model in the wrong format so far, by call (none without a model)."""
        return {"extract": 0, "verify": 0}

    def require_usable_replies(self) -> None:
        """Raise when every reply of the backend's model so far was in the wrong format."""

    def extract(self, texts: Sequence[str]) -> list[list[str]]:
        raise NotImplementedError

    def verify(self, topic: str, facts: Sequence[str], passages: Sequence[tuple[str, str]]) -> list[FactVerdict]:
        raise NotImplementedError

    def fact_key(self, topic: str, fact: str, passages: Sequence[tuple[str, str]]) -> Hashable:
        """Facts with one key are one fact: a text that states a fact again (another case, a final
        "!") does not count it twice. The length penalty pays for more facts, so restating one
        true sentence would climb from exp(-9) towards 1. By its words here
        (case-folded, spaces collapsed, a trailing .!?;:, stripped); a backend that reads facts
        into triples keys them by those."""
        return " ".join(fact.casefold().split()).rstrip(" .!?;:,")

    def score(self, topic: str, text: str) -> FactScore:
        return self.score_many([(topic, text)])[0]

    def score_many(self, items: Sequence[tuple[str, str]]) -> list[FactScore]:
        # Facts of every new text in one extraction call (one batch to an endpoint).
        new = list(dict.fromkeys(text for _, text in items if text not in self.fact_cache))
        if new:
            self.calls["extract"] += len(new)
            for text, facts in zip(new, self.extract(new)):
                self.fact_cache[text] = list(dict.fromkeys(f.strip() for f in facts if f and f.strip()))
        out = []
        for topic, text in items:
            facts = self.fact_cache[text]
            passages = self.kb.passages(topic) if facts else []
            if passages is None:
                if topic not in self.missing_topics:
                    self.missing_topics.add(topic)
                    print(f"factscore: no KB document for topic {topic!r}: factuality 0 for its samples",
                          file=self.log, flush=True)
                out.append(FactScore(topic, (), missing_topic=True, gamma=self.gamma))
                continue
            todo = [f for f in facts if (topic, f) not in self.verdict_cache]
            if todo:
                self.calls["verify"] += len(todo)
                for verdict in self.verify(topic, todo, passages):
                    self.verdict_cache[(topic, verdict.fact)] = verdict
            kept, seen = [], set()  # the first fact of each key
            for f in facts:
                key = self.fact_key(topic, f, passages)
                if key not in seen:
                    seen.add(key)
                    kept.append(f)
            out.append(FactScore(topic, tuple(self.verdict_cache[(topic, f)] for f in kept), gamma=self.gamma))
        return out
