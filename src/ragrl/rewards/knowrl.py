"""KnowRL's rewards as small pure functions of the completion text (zjunlp/KnowRL HEAD,
train/reward_function/{format,correct,combined,fact}_reward.py).

- format: +1 when the whole completion is `<think>…</think><answer>…</answer>` (both non-empty,
  whitespace allowed between and around), else −1. KnowRL's regex forbids an opening <think> or
  <answer> inside the parts; here no protocol tag at all may appear inside them, so a repeated
  closing tag ("…</think></think><answer>…") is a format error (theirs lets it through).
- correctness: the grade of the answer text (first <answer>…</answer>): correct +2, not attempted
  (a refusal such as "I don't know") +1, incorrect −1; no answer tag or an empty answer is
  incorrect, as in KnowRL. An unreadable LLM grade scores 0, as in KnowRL.
- factuality: the fact score of the think text (the first <think>…</think>, else the whole
  completion, as theirs; with `think_prefilled`, ours, the text up to the first </think>, so the
  answer is not scored as reasoning), i.e. mean supported × length penalty.
- fact_mode `additive` (the paper): the factuality term is added to every sample; `wrong_only`
  (KnowRL's code at HEAD, combined_reward.py): added only where the grade is incorrect.

The total is Σ weight × component over format, correct, fact (weights from the recipe; all 1 in
KnowRL, where TRL sums format_reward_func and combined_reward_func).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ragrl.agent.protocol import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN, split_blocks
from ragrl.errors import InputError
from ragrl.rewards.qa import exact_match, normalize_answer

CORRECTNESS = {"correct": 2.0, "not_attempted": 1.0, "incorrect": -1.0, "unparsed": 0.0}
FACT_MODES = ("additive", "wrong_only")
REWARD_KEYS = ("format", "correct", "fact")

_TAG = r"</?(?:think|answer|search|information|kg-query)>"
# A part is all the text up to the next protocol tag, checked non-blank after the match. It cannot
# hold a tag, so each part ends at one place: linear time. (A lazy `\S…*?` part between `\s*`s had
# a way to split every whitespace run, cubic on long ones: 90 s for two runs of 4,000 spaces; and
# its first character went unchecked, so "<think></think></think><answer>…" passed.)
_PART = rf"(?:(?!{_TAG})[\s\S])*"
_FORMAT = re.compile(rf"<think>({_PART})</think>\s*<answer>({_PART})</answer>")

# What SimpleQA's grader calls NOT_ATTEMPTED when the model says so itself, after SQuAD
# normalisation (lowercase, no punctuation or articles): KnowRL's prompt asks for "I don't know".
_REFUSALS = ("i dont know", "i do not know", "i am not sure", "im not sure", "not sure", "unknown", "no idea",
             "i cannot answer", "i cant answer", "cannot answer", "i dont have enough information",
             "i do not have enough information", "i cannot determine", "i cant determine")


def _text(completion) -> str:
    return completion if isinstance(completion, str) else ""


def format_reward(completion, think_prefilled: bool = False) -> float:
    """+1 if the whole completion is <think>…</think><answer>…</answer>, else −1.
    `think_prefilled`: the prompt ends with <think> (KnowRL's chat template), so it is prepended."""
    text = _text(completion).strip()
    if think_prefilled and not text.startswith("<think>"):
        text = "<think>" + text
    m = _FORMAT.fullmatch(text)
    return 1.0 if m and m[1].strip() and m[2].strip() else -1.0


def think_text(completion, think_prefilled: bool = False) -> str:
    """The reasoning the fact term scores: the first <think>…</think>, else the whole completion
    (KnowRL's fact_reward.py). `think_prefilled` (ours: the prompt opened the <think>): the text
    up to the first </think>; without it the completion has no opening tag and the whole of it,
    answer and tags included, would be scored as reasoning."""
    text = _text(completion)
    if think_prefilled and not text.lstrip().startswith("<think>") and "</think>" in text:
        return text.partition("</think>")[0].strip()
    blocks = split_blocks(text, THINK_OPEN, THINK_CLOSE)
    return (blocks[1] if len(blocks) > 1 else text).strip()


def answer_text(completion) -> str | None:
    blocks = split_blocks(_text(completion), ANSWER_OPEN, ANSWER_CLOSE)
    return blocks[1].strip() if len(blocks) > 1 else None


def is_refusal(answer: str | None) -> bool:
    if answer is None:
        return False
    norm = normalize_answer(answer)
    return any(norm == r or norm.startswith(r + " ") for r in _REFUSALS)


def em_grade(answer: str | None, golds: str | Iterable[str]) -> str:
    """The embedded default's grader: exact match after SQuAD normalisation → correct, else a
    refusal → not_attempted, anything else (no answer, an empty one, a wrong one) → incorrect.
    The match comes first: a gold that begins like a refusal ("Unknown Pleasures") is an answer."""
    if answer is None or not answer.strip():
        return "incorrect"
    if exact_match(answer, golds):
        return "correct"
    return "not_attempted" if is_refusal(answer) else "incorrect"


def knowrl_reward(fmt: float, grade: str, factuality: float, *, fact_mode: str = "additive",
                  weights: Mapping[str, float] | None = None, fact_components: Mapping[str, float] | None = None
                  ) -> tuple[float, dict[str, float]]:
    """The total reward and every component for the log."""
    if fact_mode not in FACT_MODES:
        raise InputError(f"fact_mode {fact_mode!r}: expected one of {FACT_MODES}")
    weights = {"format": 1.0, "correct": 1.0, "fact": 1.0} if weights is None else weights
    correct = CORRECTNESS.get(grade, 0.0)
    applied = fact_mode == "additive" or grade == "incorrect"
    parts = {"format": fmt, "correct": correct, "fact": factuality if applied else 0.0}
    total = sum(float(weights.get(k, 0.0)) * v for k, v in parts.items())
    components = {**parts, "factuality": factuality, "fact_applied": float(applied),
                  "refusal": float(grade == "not_attempted"), "is_correct": float(grade == "correct"),
                  "is_incorrect": float(grade == "incorrect"), **(fact_components or {})}
    return total, components


def simpleqa_rates(grades: Iterable[str]) -> dict[str, float]:
    """SimpleQA's headline numbers: the share of correct, incorrect and not-attempted answers, and
    the accuracy among attempted ones and their F-score (simple-evals' `simpleqa_eval.py`).
    An unparsed grade counts as incorrect."""
    grades = list(grades)
    n = len(grades)
    if n == 0:
        return {"correct": 0.0, "incorrect": 0.0, "not_attempted": 0.0, "accuracy_given_attempted": 0.0,
                "f1": 0.0, "n": 0.0}
    correct = sum(g == "correct" for g in grades) / n
    not_attempted = sum(g == "not_attempted" for g in grades) / n
    incorrect = sum(g not in ("correct", "not_attempted") for g in grades) / n
    attempted = correct + incorrect
    acc = correct / attempted if attempted > 0 else 0.0
    f1 = 2 * acc * correct / (acc + correct) if acc + correct > 0 else 0.0
    return {"correct": correct, "incorrect": incorrect, "not_attempted": not_attempted,
            "accuracy_given_attempted": acc, "f1": f1, "n": float(n)}
