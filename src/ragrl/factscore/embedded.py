"""The embedded backend: sentence/clause facts, verified by the world's own sentence templates.

Deviation from KnowRL (which has an LLM write atomic facts and an NLI model check each against the
topic document's top-5 passages): here an atomic fact is a sentence of the text, or a clause of
it where the sentence as a whole states no known relation (split at ';', ', and', ' and ', ', but',
', while'; a clause without its own subject borrows the previous clause's). Questions ('?') are
not facts. A fact is supported when one of the world's templates (ragrl.toy.relations) parses it
into a (head, relation, tail) triple that the topic's KB document states, the document's own
sentences parsed by the same templates. A referring expression for the topic ("The city", the
surname of a person) counts as the topic. What no template parses (opinions, fillers, hedges) is
a fact that is never supported, as an NLI model would find no entailing passage for it.
Comparisons ignore case, extra spaces, a final period and thousands separators. A fact the text
states again (the same triples, in any template or case) counts once (`fact_key`).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Sequence
from functools import lru_cache

from ragrl.factscore.core import FactScorer, FactVerdict

_CLAUSE_SPLIT = re.compile(r"\s*;\s*|,\s+and\s+|\s+and\s+|,\s+but\s+|,\s+while\s+")
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")
# No template sentence is this long; a run-on "sentence" of a degenerate rollout is not parsed.
_MAX_FACT_CHARS = 1000
_INITIAL_END = re.compile(r"(?:^|\s)[A-Z]\.$")

Triple = tuple[str, str, str]


def _norm(s: str) -> str:
    s = _DIGIT_COMMA.sub("", s.strip().rstrip(".!").strip())
    return " ".join(s.lower().split())


@lru_cache(maxsize=1)
def _templates() -> tuple[tuple[str, re.Pattern[str]], ...]:
    from ragrl.toy.relations import RELATIONS

    out = []
    for rel in RELATIONS:
        for tpl in rel.sentences:
            body = re.escape(tpl.rstrip(".")).replace(r"\{h\}", "(?P<h>.+?)").replace(r"\{t\}", "(?P<t>.+?)")
            out.append((rel.key, re.compile(f"^{body}$", re.IGNORECASE)))
    return tuple(out)


def _anaphors() -> frozenset[str]:
    from ragrl.toy.relations import ANAPHORS

    return frozenset(a.lower() for a in ANAPHORS.values())


def parse_triples(sentence: str, topic: str | None = None) -> set[Triple]:
    """Every (head, relation, tail) a template reads in `sentence`, normalised; a head that refers
    to `topic` (its anaphor, its last name) is the topic."""
    text = sentence.strip().rstrip(".!").strip()
    if len(text) > _MAX_FACT_CHARS:
        return set()
    topic_n = _norm(topic) if topic else None
    out = set()
    for key, pattern in _templates():
        m = pattern.match(text)
        if m is None:
            continue
        head, tail = _norm(m.group("h")), _norm(m.group("t"))
        if topic_n and (head in _anaphors() or head == topic_n.split()[-1]):
            head = topic_n
        out.add((head, key, tail))
    return out


def sentences(text: str) -> list[str]:
    """KnowRL's sentence split, except after a middle initial ("Kila V. Daisam"), which the world's
    person names have and which would cut a fact in two."""
    from ragrl.kb.build import split_into_sentences

    out: list[str] = []
    for piece in split_into_sentences(text):
        if out and _INITIAL_END.search(out[-1]):
            out[-1] = f"{out[-1]} {piece}"
        else:
            out.append(piece)
    return out


def atomic_facts(text: str) -> list[str]:
    """The sentences of `text`; a sentence is split into its clauses when more of them state a
    relation than the sentence read whole does (a lazy template match of a compound sentence
    reads one wrong triple; a name with "and" in it stays whole)."""
    facts = []
    for sentence in sentences(text):
        if sentence.endswith("?"):
            continue
        parts = _clauses(sentence) if _CLAUSE_SPLIT.search(sentence) else []
        stated = sum(bool(parse_triples(p)) for p in parts)
        if stated >= 2 or (stated == 1 and not parse_triples(sentence)):
            facts += [p + "." for p in parts]
        else:
            facts.append(sentence)
    return facts


def _clauses(sentence: str) -> list[str]:
    """The clauses of `sentence`; one without a subject of its own borrows the previous one's."""
    out, subject = [], None
    for clause in (c.strip().rstrip(".") for c in _CLAUSE_SPLIT.split(sentence.rstrip("."))):
        if not clause:
            continue
        if not parse_triples(clause) and subject is not None and parse_triples(f"{subject} {clause}"):
            clause = f"{subject} {clause}"
        if parse_triples(clause):
            subject = _original_head(clause)
        out.append(clause)
    return out


def _original_head(clause: str) -> str | None:
    for _, pattern in _templates():
        m = pattern.match(clause.strip().rstrip("."))
        if m is not None:
            return m.group("h")
    return None


def document_triples(topic: str, passages: Iterable[str]) -> dict[Triple, str]:
    """Triple → the sentence that states it, for every sentence of the topic's passages."""
    out: dict[Triple, str] = {}
    for passage in passages:
        for sentence in sentences(passage):
            for triple in parse_triples(sentence, topic):
                out.setdefault(triple, sentence)
    return out


class EmbeddedFactScorer(FactScorer):
    def __init__(self, kb, gamma: int = 10, log=None) -> None:
        super().__init__(kb, gamma, log)
        self._doc_triples: dict[str, dict[Triple, str]] = {}

    def extract(self, texts: Sequence[str]) -> list[list[str]]:
        return [atomic_facts(t) for t in texts]

    def fact_key(self, topic: str, fact: str, passages: Sequence[tuple[str, str]]) -> Hashable:
        # The triples the templates read: the same fact in another template or with the surname
        # is the same fact. What no template reads is keyed by its words.
        claims = frozenset().union(*(parse_triples(fact, t) for t in dict.fromkeys(t for t, _ in passages)))
        return claims or super().fact_key(topic, fact, passages)

    def verify(self, topic: str, facts: Sequence[str], passages: Sequence[tuple[str, str]]) -> list[FactVerdict]:
        if topic not in self._doc_triples:
            # Each title of a multi-title topic resolves its own anaphors.
            stated: dict[Triple, str] = {}
            for title, passage in passages:
                for triple, sentence in document_triples(title, [passage]).items():
                    stated.setdefault(triple, sentence)
            self._doc_triples[topic] = stated
        stated = self._doc_triples[topic]
        titles = [t for t, _ in passages]
        verdicts = []
        for fact in facts:
            claims = set().union(*(parse_triples(fact, t) for t in dict.fromkeys(titles))) if titles else set()
            hit = next((stated[c] for c in sorted(claims) if c in stated), None)
            verdicts.append(FactVerdict(fact, hit is not None, hit))
        return verdicts
