"""QA metrics and rule-based rewards for search agents. Small pure functions of strings.

Metrics follow the SQuAD evaluation script (normalisation, exact match, token F1) and the "cover"
exact match of Search-R1 / FlashRAG (a normalised gold answer occurs in the normalised
prediction), with one departure: a gold that normalises to nothing ("The The") is compared with its
articles kept, where SQuAD's script matches it with any empty answer. A missing prediction (None)
scores 0 everywhere.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from ragrl.agent.protocol import (
    ACTION_NAMES,
    ANSWER_CLOSE,
    ANSWER_OPEN,
    PROTOCOL_TAGS,
    THINK_CLOSE,
    THINK_OPEN,
    TurnRecord,
    parse_turns,
    recorded_turns,
)
from ragrl.agent.protocol import split_information as split_observations
from ragrl.errors import InputError

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANY_TAG = re.compile("|".join(re.escape(t) for t in PROTOCOL_TAGS))

def _golds(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [g for g in golds if isinstance(g, str)]


def _keep_articles(s: str) -> str:
    """SQuAD's normalisation but the articles: lowercase, drop ASCII punctuation, collapse whitespace."""
    return " ".join("".join(ch for ch in s.lower() if ch not in _PUNCT).split())


def normalize_answer(s: str) -> str:
    """SQuAD: lowercase, drop ASCII punctuation, drop articles a/an/the, collapse whitespace."""
    return " ".join(_ARTICLES.sub(" ", _keep_articles(s)).split())


def _compared(pred: str, gold: str) -> tuple[str, str, bool] | None:
    """The prediction and gold as the metrics compare them, and whether as whole words only: both
    SQuAD-normalised, or, for a gold that normalises to nothing ("The The", "A"), both with their
    articles kept and whole words only, so that "the the" matches it and an empty or article-only
    answer does not (under plain SQuAD it matches every such answer: a reward a policy finds; and
    character-level, "A" would cover every answer with an "a" in it). None when the gold is
    nothing either way ("?")."""
    if g := normalize_answer(gold):
        return normalize_answer(pred), g, False
    if g := _keep_articles(gold):
        return _keep_articles(pred), g, True
    return None


def exact_match(pred: str | None, golds: str | Iterable[str]) -> float:
    if pred is None:
        return 0.0
    return float(any(c is not None and c[0] == c[1] for c in (_compared(pred, g) for g in _golds(golds))))


def f1(pred: str | None, golds: str | Iterable[str]) -> float:
    """Token-level F1 against each gold, the best one counts."""
    if pred is None:
        return 0.0
    return max((_f1_one(pred, g) for g in _golds(golds)), default=0.0)


def _f1_one(pred: str, gold: str) -> float:
    if (c := _compared(pred, gold)) is None:
        return 0.0
    p, g = c[0].split(), c[1].split()
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def cover_exact_match(pred: str | None, golds: str | Iterable[str]) -> float:
    """1.0 if some normalised gold is a substring of the normalised prediction.

    Character-level, as in Search-R1's `subem`: gold "1974" covers "in 1974" and also "19745"; a
    gold that normalises to nothing as whole words (`_compared`).
    """
    if pred is None:
        return 0.0
    return float(any(c is not None and (f" {c[1]} " in f" {c[0]} " if c[2] else c[1] in c[0])
                     for c in (_compared(pred, g) for g in _golds(golds))))


def strip_observations(text: str) -> str:
    """Remove <information>…</information> blocks: they are the environment's text, not the model's."""
    return "".join(split_observations(text)[0::2])


def extract_answer(text: str) -> str | None:
    """Content (stripped) of the LAST <answer>…</answer> outside observations, None if there is none.

    The last closing tag is paired with the nearest opening tag before it, the same pairing the
    rollout parser uses, so `<answer>a<answer>b</answer>` gives "b".
    """
    text = strip_observations(text)
    close = text.rfind(ANSWER_CLOSE)
    if close < 0:
        return None
    open_ = text.rfind(ANSWER_OPEN, 0, close)
    if open_ < 0:
        return None
    return text[open_ + len(ANSWER_OPEN) : close].strip()


def format_reward(response_text: str, tools: str | Sequence[str] = ("search",)) -> float:
    """`turns_format_reward` of the turns re-read from a decoded response, for reading saved
    transcripts offline. No reward calls it: an <information> block the policy typed reads as an
    observation here (rewards score `recorded_turns`)."""
    return turns_format_reward(parse_turns(response_text), tools)


def turns_format_reward(turns: Sequence[TurnRecord], tools: str | Sequence[str] = ("search",)) -> float:
    """1.0 if the whole response is well formed, else 0.0.

    Well formed: each assistant turn is `<think>…</think>` followed by exactly one action with
    plain-text content (optional whitespace around; a tool action's content must not be blank),
    every turn but the last is a tool action (one of `tools`, the environment's action tags other
    than answer: "search", "kg-query"; empty for a closed-book answer) the environment took as
    valid (its turn record says; a search whose queries split to nothing is not), and the last is an
    <answer> (possibly empty: that is for the answer metrics to punish). The turn after the
    turn-limit notice is exempt from the <think> requirement, because the environment prefilled
    its <answer> tag.

    Binary on purpose: a graded score (fraction of good turns) pays for padding the response with
    extra well-formed searches.
    """
    tools = (tools,) if isinstance(tools, str) else tuple(tools)
    unknown = [t for t in tools if t not in ACTION_NAMES or t == "answer"]
    if unknown:
        raise InputError(f"unknown tool action(s) {unknown}; expected some of {[a for a in ACTION_NAMES if a != 'answer']}")
    if not turns:
        return 0.0
    last = len(turns) - 1
    for i, turn in enumerate(turns):
        kind = turn_kind(turn.text, require_think=not turn.after_notice)
        if not (kind == "answer" if i == last else kind in tools and turn.valid):
            return 0.0
    return 1.0


def _first_shown(turns: Sequence[TurnRecord], supporting_ids: Sequence[str], reward: str) -> tuple[list[int], int]:
    """Per turn, how many of the question's supporting passages its observation showed first, and
    how many there are (the turn record's `retrieved` ids, never the policy's text)."""
    wanted = {str(i) for i in supporting_ids}
    if not wanted:
        raise InputError(f"{reward} needs the question's supporting passage ids (QA column supporting_ids)")
    seen: set[str] = set()
    counts = []
    for turn in turns:
        new = (wanted & set(turn.retrieved)) - seen
        seen |= new
        counts.append(len(new))
    return counts, len(wanted)


def support_recall(turns: Sequence[TurnRecord], supporting_ids: Sequence[str]) -> float:
    """Share of the question's supporting passages that the environment showed the policy over
    the episode: a process reward for searching what the answer needs, e.g. a multi-hop
    question's second hop. Extra searches earn nothing once every supporting passage is found, so
    padding a response with searches does not pay."""
    counts, wanted = _first_shown(turns, supporting_ids, "support_recall")
    return sum(counts) / wanted


def support_gains(turns: Sequence[TurnRecord], supporting_ids: Sequence[str]) -> list[float]:
    """Per turn, the share of the question's supporting passages that its observation showed
    first: `support_recall` split over the turns that earned it, so a per-turn advantage credits
    the search that found a second hop's passage, not the whole episode. A turn that answers,
    repeats a passage already shown or searches in vain earns 0."""
    counts, wanted = _first_shown(turns, supporting_ids, "support_gains")
    return [count / wanted for count in counts]


def turn_kind(turn: str, require_think: bool = True) -> str | None:
    """The action of a well-formed turn (`<think>…</think>` then one action tag pair), or None.

    A blank <think> is not reasoning: `<think></think><answer></answer>` would otherwise be a
    well-formed turn a degenerate policy writes for the format reward alone."""
    rest = turn.strip()
    if rest.startswith(THINK_OPEN):
        end = rest.find(THINK_CLOSE)
        if end < 0 or not rest[len(THINK_OPEN) : end].strip() or _ANY_TAG.search(rest[len(THINK_OPEN) : end]):
            return None
        rest = rest[end + len(THINK_CLOSE) :].strip()
    elif require_think:
        return None
    for name in ACTION_NAMES:
        open_, close = f"<{name}>", f"</{name}>"
        if rest.startswith(open_) and rest.endswith(close) and len(rest) >= len(open_) + len(close):
            content = rest[len(open_) : len(rest) - len(close)]
            if _ANY_TAG.search(content):
                return None
            if name != "answer" and not content.strip():
                return None  # an empty query is an invalid action
            return name
    return None


def composite_reward(trajectory, golds: str | Iterable[str], weights: Mapping[str, float],
                     tools: str | Sequence[str] = ("search",)) -> float:
    """Weighted sum of metrics, e.g. weights={"em": 1.0, "format": 0.1}.

    Keys: em, f1, cover_em (of the answer) and format (of the response). The input is a
    trajectory (a `Trajectory` or its dict, as verl's reward gets it): the engine's answer and its
    recorded turns are scored, never its decoded text.
    """
    turns = recorded_turns(trajectory)
    answer = trajectory["answer"] if isinstance(trajectory, Mapping) else trajectory.answer
    unknown = set(weights) - set(METRICS) - {"format"}
    if unknown:
        raise InputError(f"unknown reward weight(s) {sorted(unknown)}; expected {sorted([*METRICS, 'format'])}")
    total = 0.0
    for key, w in weights.items():
        if not w:
            continue
        score = turns_format_reward(turns, tools) if key == "format" else METRICS[key](answer, golds)
        total += float(w) * score
    return total


METRICS = {"em": exact_match, "f1": f1, "cover_em": cover_exact_match}
