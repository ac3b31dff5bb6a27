"""KG-R1 rewards: pure functions of strings and numbers.

Turn rewards (one per assistant turn, in the rollout engine's turn order):
    format  the turn is <think>…</think> followed by exactly one action tag (the turn after the
            turn-limit notice is exempt from <think>: its <answer> was prefilled)
    query   the turn's <kg-query> parsed, succeeded, and was not asked before in this response;
            a repeated query earns nothing, so padding a response with one good query does not pay
    answer  the turn is an <answer> (KG-R1's "is_answer_score")

Every reward reads the turns the rollout engine recorded (`ragrl.agent.protocol.TurnRecord`:
the policy's text, the environment's observation), never the decoded response: a policy that
types its own `<information>` block with a gold entity in it must not earn the retrieval reward.

Global rewards (one per response):
    f1         answer F1 over entity SETS: a gold answer {text, kb_id} is one entity, matched by
               its text or its kb_id (KG-R1's first release counted text and kb_id as two golds,
               so naming an entity once earned at most half the recall)
    hits1      the first answer item is a gold entity
    retrieval  a gold answer appears in the results of a successful query (an observation)
    format     the whole response is well formed (`ragrl.rewards.qa.turns_format_reward`, env "kg")

The turn-level advantage these feed (KG-R1: A = w * A_turn[t] + A_global on loss-mask-1 tokens)
is the trainer's, in `ragrl.train.advantages`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ragrl.agent.protocol import TurnRecord, parse_action, parse_turns
from ragrl.errors import InputError
from ragrl.kg.environment import KG_SPEC
from ragrl.kg.ops import Status, status_of_message
from ragrl.kg.query_parser import KGQuery, parse_query
from ragrl.rewards.qa import normalize_answer, turn_kind, turns_format_reward

# KG-R1's defaults (turn_format_score 0.15, turn_kg_query_validity 0.1, turn_is_answer_score 0.1;
# global exact_match 0.3 — here entity F1 —, retrieval_quality 0.4; turn advantage weight 0.5).
DEFAULT_TURN_WEIGHTS: dict[str, float] = {"format": 0.15, "query": 0.1, "answer": 0.1}
DEFAULT_GLOBAL_WEIGHTS: dict[str, float] = {"f1": 0.3, "retrieval": 0.4}
TURN_KEYS = ("format", "query", "answer")
GLOBAL_KEYS = ("f1", "hits1", "retrieval", "format")

# Answer items: "|", ";" or newlines always separate; a comma separates unless it sits between
# digits ("1,234,000") or the comma-containing piece is itself a gold name ("Washington, D.C.").
_COARSE_SPLIT = re.compile(r"[|;\n]")
_COMMA_SPLIT = re.compile(r"(?<!\d),|,(?!\d)")
_NAME_PARTS = 4  # the most comma-separated parts one gold name may span ("Paris, Texas, United States")


# --------------------------------------------------------------------------- turns


@dataclass(frozen=True)
class KGTurn:
    text: str  # what the model wrote in this turn (no observation)
    action: str  # "kg-query", "answer" or "invalid"
    query: tuple[str, ...] | None = None  # KGQuery.key of a parsed query
    status: str | None = None  # status of the observation that answered it
    forced: bool = False  # the turn after the turn-limit notice


def kg_turns(turns: Sequence[TurnRecord]) -> list[KGTurn]:
    """The KG view of recorded assistant turns (`ragrl.agent.protocol.recorded_turns`), one per
    generation call of the rollout engine, so they align with its per-token turn index."""
    return [_turn(t.text, t.observation, t.after_notice) for t in turns]


def split_turns(response_text: str) -> list[KGTurn]:
    """`kg_turns` of the turns re-read from a decoded response (`parse_turns`): for offline reading
    of transcripts; an <information> block the policy typed reads as an observation here."""
    return kg_turns(parse_turns(response_text))


def _turn(text: str, info: str | None, forced: bool) -> KGTurn:
    action = parse_action(text, KG_SPEC)
    if action.kind == "kg-query":
        query = parse_query(action.queries[0])
        if not isinstance(query, KGQuery):
            return KGTurn(text, "invalid", forced=forced)
        status = status_of_message(info)
        key = _answered_key(info) if status is Status.SUCCESS else None
        return KGTurn(text, "kg-query", key or query.key, status.value if status else None, forced)
    return KGTurn(text, action.kind, forced=forced)


def _answered_key(info: str | None) -> tuple[str, ...] | None:
    """The key of the call a success message echoes on its first line ('get_relations_out("Ada
    Lovelace") found 3 relations:'): the entity as the store resolved it, so an alias or KB id of
    an entity already queried is the same query, not a new one to be rewarded again."""
    echoed = _echoed((info or "").lstrip().partition("\n")[0])
    return echoed.key if echoed is not None else None


def _echoed(line: str) -> KGQuery | None:
    """The call a success message's first line echoes: ours end it with " found N ...:", the
    KG-R1 client's with ":" (`ragrl.kg.client`)."""
    call = line.split(") found ", 1)[0] + ")" if ") found " in line else line.rstrip(":")
    echoed = parse_query(call)
    return echoed if isinstance(echoed, KGQuery) else None


def turn_format_ok(text: str, forced: bool = False) -> bool:
    """<think>…</think> then exactly one <kg-query> or <answer> tag pair with plain-text content
    (the turn after the turn-limit notice is exempt from <think>: its <answer> was prefilled)."""
    return turn_kind(text, require_think=not forced) in ("kg-query", "answer")


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
        for norm in _comma_items(piece, known):
            if norm and norm not in items:
                items.append(norm)
    return items


def _comma_items(piece: str, known: set[str]) -> list[str]:
    """A comma list's normalised items, where consecutive parts that together name a gold entity
    ("Washington, D.C.") stay one item: the longest such run of up to _NAME_PARTS parts from each
    part on (bounded, so a model's list of thousands of commas stays linear)."""
    parts = _COMMA_SPLIT.split(piece)
    out, i = [], 0
    while i < len(parts):
        last = min(len(parts), i + _NAME_PARTS) if known else i + 1
        end = next((j for j in range(last, i + 1, -1) if normalize_answer(",".join(parts[i:j])) in known), i + 1)
        out.append(normalize_answer(",".join(parts[i:end])))
        i = end
    return out


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


def observations(turns: Sequence[TurnRecord]) -> list[str]:
    """What the environment returned to the recorded turns, in order."""
    return [t.observation for t in turns if t.observation is not None]


def retrieval_hit(observation_texts: Iterable[str], golds: Iterable[Mapping[str, object] | str]) -> float:
    """1.0 if a gold entity's text/kb_id is one of the results (as whole words) of a successful query.

    Only results count: error messages suggest names and list relations, and a suggestion is not
    a retrieval; nor is the query's own argument, which a success names in the ambiguity note of
    ours ('(Note: 2 entities are named "Paris"...)') and in the header of KG-R1's server
    ('Outgoing relations for entity "Paris":'), in quotes both, so querying a gold name is not
    retrieving it. Only the quoted name goes: a result that contains it ("Paris, Texas" from
    "Texas") still counts.
    """
    keys = set().union(*gold_entities(golds))
    for obs in observation_texts:
        if status_of_message(obs) is not Status.SUCCESS:
            continue
        head, _, body = obs.strip().partition("\n")
        lines = [ln for ln in body.split("\n") if not ln.lstrip().startswith("(Note: ")]
        text = "\n".join(lines)
        echoed = _echoed(head)
        for arg in echoed.args if echoed is not None else ():
            text = text.replace(f'"{arg}"', " ")
        norm = f" {normalize_answer(text)} "
        if any(f" {k} " in norm for k in keys):
            return 1.0
    return 0.0


def global_reward_components(turns: Sequence[TurnRecord], golds: Sequence[Mapping[str, object] | str],
                             answer: str | None) -> dict[str, float]:
    """{"f1", "hits1", "retrieval", "format"} of one response: its final answer and recorded turns."""
    return {
        "f1": entity_f1(answer, golds),
        "hits1": hits_at_1(answer, golds),
        "retrieval": retrieval_hit(observations(turns), golds),
        "format": turns_format_reward(turns, KG_SPEC.tools),
    }


def weighted_sum(components: Mapping[str, float], weights: Mapping[str, float],
                 known: Sequence[str] | None = None) -> float:
    """Σ weight * component; an unknown weight key is an error (a typo would silently weigh 0)."""
    allowed = set(known) if known is not None else set(components)
    unknown = set(weights) - allowed
    if unknown:
        raise InputError(f"unknown reward weight(s) {sorted(unknown)}; expected some of {sorted(allowed)}")
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


def kg_rewards(turns: Sequence[TurnRecord], golds: Sequence[Mapping[str, object] | str], answer: str | None,
               turn_weights: Mapping[str, float] = DEFAULT_TURN_WEIGHTS,
               global_weights: Mapping[str, float] = DEFAULT_GLOBAL_WEIGHTS) -> KGRewards:
    """Turn and global rewards of one response from its recorded turns and the engine's answer."""
    tc = turn_reward_components(kg_turns(turns))
    gc = global_reward_components(turns, golds, answer)
    return KGRewards([weighted_sum(c, turn_weights, TURN_KEYS) for c in tc],
                     weighted_sum(gc, global_weights, GLOBAL_KEYS), tc, gc)
