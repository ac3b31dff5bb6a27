"""KG-R1 rewards: pure functions of strings and numbers.

Turn rewards (one per assistant turn, in the rollout engine's turn order):
    format  the turn is <think>…</think> followed by exactly one action tag (the turn after the
            turn-limit notice is exempt from <think>: its <answer> was prefilled)
    query   the turn's <kg-query> parsed, succeeded, and was not asked before in this response;
            a repeated query earns nothing, so padding a response with one good query does not pay
    answer  the turn is an <answer> (KG-R1's "is_answer_score")

Global rewards (one per response):
    f1         answer F1 over entity SETS: a gold answer {text, kb_id} is one entity, matched by
               its text or its kb_id (KG-R1's first release counted text and kb_id as two golds,
               so naming an entity once earned at most half the recall)
    hits1      the first answer item is a gold entity
    retrieval  a gold answer appears in the results of a successful query (an observation)
    format     the whole response is well formed (`ragrl.rewards.qa.format_reward`, env "kg")

The turn-level advantage these feed (KG-R1: A = w * A_turn[t] + A_global on loss-mask-1 tokens)
is the trainer's, in `ragrl.train.advantages`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ragrl.agent.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    KG_CLOSE,
    KG_OPEN,
    PROTOCOL_TAGS,
    THINK_CLOSE,
    THINK_OPEN,
    TURN_LIMIT_NOTICE,
    parse_action,
)
from ragrl.kg.environment import KG_SPEC
from ragrl.kg.ops import Status, status_of_message
from ragrl.kg.query_parser import KGQuery, parse_query
from ragrl.rewards.qa import extract_answer, format_reward, normalize_answer, split_observations

# KG-R1's defaults (turn_format_score 0.15, turn_kg_query_validity 0.1, turn_is_answer_score 0.1;
# global exact_match 0.3 — here entity F1 —, retrieval_quality 0.4; turn advantage weight 0.5).
DEFAULT_TURN_WEIGHTS: dict[str, float] = {"format": 0.15, "query": 0.1, "answer": 0.1}
DEFAULT_GLOBAL_WEIGHTS: dict[str, float] = {"f1": 0.3, "retrieval": 0.4}
TURN_KEYS = ("format", "query", "answer")
GLOBAL_KEYS = ("f1", "hits1", "retrieval", "format")

_ANY_TAG = re.compile("|".join(re.escape(t) for t in PROTOCOL_TAGS))
# Answer items: "|", ";" or newlines always separate; a comma separates unless it sits between
# digits ("1,234,000") or the comma-containing piece is itself a gold name ("Washington, D.C.").
_COARSE_SPLIT = re.compile(r"[|;\n]")
_COMMA_SPLIT = re.compile(r"(?<!\d),|,(?!\d)")


# --------------------------------------------------------------------------- turns


@dataclass(frozen=True)
class KGTurn:
    text: str  # what the model wrote in this turn (no observation)
    action: str  # "kg-query", "answer" or "invalid"
    query: tuple[str, ...] | None = None  # KGQuery.key of a parsed query
    status: str | None = None  # status of the observation that answered it
    forced: bool = False  # the turn after the turn-limit notice


def split_turns(response_text: str) -> list[KGTurn]:
    """The assistant turns of a decoded response, aligned with the rollout engine's turn index.

    The response alternates turn, <information>, turn, …; the empty gap before the turn-limit
    notice is not a turn, and neither is a whitespace-only tail after the last observation (a
    trajectory stopped by a length limit generated nothing there).
    """
    pieces = split_observations(response_text)
    texts, infos = pieces[0::2], pieces[1::2]
    turns: list[KGTurn] = []
    for i, text in enumerate(texts):
        info = infos[i] if i < len(infos) else None
        if i > 0 and info is not None and not text.strip() and info.strip() == TURN_LIMIT_NOTICE:
            continue
        if info is None and i > 0 and not text.strip():
            continue
        forced = i > 0 and infos[i - 1].strip() == TURN_LIMIT_NOTICE
        turns.append(_turn(text, info, forced))
    return turns


def _turn(text: str, info: str | None, forced: bool) -> KGTurn:
    action = parse_action(text, KG_SPEC)
    if action.kind == "kg-query":
        query = parse_query(action.queries[0])
        if not isinstance(query, KGQuery):
            return KGTurn(text, "invalid", forced=forced)
        status = status_of_message(info)
        return KGTurn(text, "kg-query", query.key, status.value if status else None, forced)
    return KGTurn(text, action.kind, forced=forced)


def turn_format_ok(text: str, forced: bool = False) -> bool:
    """<think>…</think> then exactly one <kg-query> or <answer> tag pair with plain-text content."""
    rest = text.strip()
    if rest.startswith(THINK_OPEN):
        end = rest.find(THINK_CLOSE)
        if end < 0 or _ANY_TAG.search(rest[len(THINK_OPEN) : end]):
            return False
        rest = rest[end + len(THINK_CLOSE) :].strip()
    elif not forced:
        return False
    for open_, close in ((KG_OPEN, KG_CLOSE), (ANSWER_OPEN, ANSWER_CLOSE)):
        if rest.startswith(open_) and rest.endswith(close) and len(rest) >= len(open_) + len(close):
            content = rest[len(open_) : len(rest) - len(close)]
            if _ANY_TAG.search(content):
                return False
            return open_ == ANSWER_OPEN or bool(content.strip())
    return False


def turn_reward_components(turns: Sequence[KGTurn]) -> list[dict[str, float]]:
    """Per turn {"format", "query", "answer"} in {0, 1}; a query counts once per response."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for turn in turns:
        new_success = (turn.action == "kg-query" and turn.status == Status.SUCCESS.value
                       and turn.query is not None and turn.query not in seen)
        if new_success:
            seen.add(turn.query)
        out.append({"format": float(turn_format_ok(turn.text, turn.forced)), "query": float(new_success),
                    "answer": float(turn.action == "answer")})
    return out


def turn_rewards(turns: Sequence[KGTurn], weights: Mapping[str, float] = DEFAULT_TURN_WEIGHTS) -> list[float]:
    return [weighted_sum(c, weights, TURN_KEYS) for c in turn_reward_components(turns)]


# --------------------------------------------------------------------------- global: answers


def gold_entities(golds: Iterable[Mapping[str, object] | str]) -> list[frozenset[str]]:
    """Normalised surface forms per gold entity; entries sharing a kb_id are one entity."""
    entities: list[set[str]] = []
    by_kb: dict[str, int] = {}
    for gold in golds:
        if isinstance(gold, str):
            kb, forms = None, [gold]
        elif isinstance(gold, Mapping):
            kb = gold.get("kb_id") if isinstance(gold.get("kb_id"), str) and gold.get("kb_id") else None
            aliases = gold.get("aliases") or []
            forms = [gold.get("text"), kb, *(aliases if isinstance(aliases, (list, tuple)) else [])]
        else:
            continue
        keys = {normalize_answer(f) for f in forms if isinstance(f, str)} - {""}
        if not keys:
            continue
        if kb is not None and kb in by_kb:
            entities[by_kb[kb]] |= keys
            continue
        if kb is None and keys in entities:
            continue
        if kb is not None:
            by_kb[kb] = len(entities)
        entities.append(keys)
    unique: list[frozenset[str]] = []
    for e in map(frozenset, entities):
        if e not in unique:
            unique.append(e)
    return unique


def answer_items(answer: str | None, golds: Sequence[frozenset[str]] = ()) -> list[str]:
    """Normalised, distinct answer items of an <answer> content, in order."""
    if answer is None:
        return []
    known = set().union(*golds) if golds else set()
    items: list[str] = []
    for piece in _COARSE_SPLIT.split(answer):
        parts = [piece] if normalize_answer(piece) in known else _COMMA_SPLIT.split(piece)
        for part in parts:
            norm = normalize_answer(part)
            if norm and norm not in items:
                items.append(norm)
    return items


def entity_f1(answer: str | None, golds: Iterable[Mapping[str, object] | str]) -> float:
    """F1 between the set of answered entities and the set of gold entities.

    Each answer item maps to the gold entity it names (by text, kb_id or alias) or stands for
    itself; items naming the same gold entity are one predicted entity.
    """
    gold = gold_entities(golds)
    items = answer_items(answer, gold)
    if not items or not gold:
        return 0.0
    predicted: set[tuple[str, object]] = set()
    matched: set[int] = set()
    for item in items:
        hits = [j for j, g in enumerate(gold) if item in g]
        predicted.add(("gold", hits[0]) if hits else ("other", item))
        matched.update(hits)
    correct = sum(1 for kind, _ in predicted if kind == "gold")
    if not correct:
        return 0.0
    precision, recall = correct / len(predicted), len(matched) / len(gold)
    return 2 * precision * recall / (precision + recall)


def hits_at_1(answer: str | None, golds: Iterable[Mapping[str, object] | str]) -> float:
    gold = gold_entities(golds)
    items = answer_items(answer, gold)
    return float(bool(items) and any(items[0] in g for g in gold))


def observations(response_text: str) -> list[str]:
    """Contents of the <information> blocks of a response, in order."""
    return split_observations(response_text)[1::2]


def retrieval_hit(observation_texts: Iterable[str], golds: Iterable[Mapping[str, object] | str]) -> float:
    """1.0 if a gold entity's text/kb_id is one of the results (as whole words) of a successful query.

    Only the result lines count: error messages suggest names and list relations, and a
    suggestion is not a retrieval.
    """
    keys = set().union(*gold_entities(golds))
    for obs in observation_texts:
        if status_of_message(obs) is not Status.SUCCESS:
            continue
        _, _, body = obs.strip().partition("\n")
        norm = f" {normalize_answer(body)} "
        if any(f" {k} " in norm for k in keys):
            return 1.0
    return 0.0


def global_reward_components(response_text: str, golds: Sequence[Mapping[str, object] | str],
                             answer: str | None = None) -> dict[str, float]:
    """{"f1", "hits1", "retrieval", "format"} of one response; `answer` defaults to its last <answer>."""
    answer = extract_answer(response_text) if answer is None else answer
    return {
        "f1": entity_f1(answer, golds),
        "hits1": hits_at_1(answer, golds),
        "retrieval": retrieval_hit(observations(response_text), golds),
        "format": format_reward(response_text, KG_SPEC.tools),
    }


def weighted_sum(components: Mapping[str, float], weights: Mapping[str, float],
                 known: Sequence[str] | None = None) -> float:
    """Σ weight * component; an unknown weight key is an error (a typo would silently weigh 0)."""
    allowed = set(known) if known is not None else set(components)
    unknown = set(weights) - allowed
    if unknown:
        raise ValueError(f"unknown reward weight(s) {sorted(unknown)}; expected some of {sorted(allowed)}")
    return float(sum(float(w) * float(components.get(k, 0.0)) for k, w in weights.items() if w))


@dataclass(frozen=True)
class KGRewards:
    turn_rewards: list[float]
    global_reward: float
    turn_components: list[dict[str, float]] = field(default_factory=list)
    global_components: dict[str, float] = field(default_factory=dict)

    @property
    def scalar(self) -> float:
        """KG-R1's logged total: mean turn reward + global reward (0 turn part without turns)."""
        mean_turn = sum(self.turn_rewards) / len(self.turn_rewards) if self.turn_rewards else 0.0
        return mean_turn + self.global_reward


def kg_rewards(response_text: str, golds: Sequence[Mapping[str, object] | str],
               turn_weights: Mapping[str, float] = DEFAULT_TURN_WEIGHTS,
               global_weights: Mapping[str, float] = DEFAULT_GLOBAL_WEIGHTS, answer: str | None = None) -> KGRewards:
    """Turn and global rewards of one decoded response."""
    turns = split_turns(response_text)
    tc = turn_reward_components(turns)
    gc = global_reward_components(response_text, golds, answer)
    return KGRewards([weighted_sum(c, turn_weights, TURN_KEYS) for c in tc],
                     weighted_sum(gc, global_weights, GLOBAL_KEYS), tc, gc)
