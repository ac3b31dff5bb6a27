"""KnowRL: a single-turn reasoner rewarded for format, a correct answer or an honest refusal, and
reasoning that a knowledge base supports (zjunlp/KnowRL; docs/KNOWRL.md).

Environment: none to call. The policy writes `<think>…</think><answer>…</answer>` in one turn
(`ClosedBookEnvironment`: only <answer> is an action, so a tool call is answered as invalid and
never executed); the knowledge base is read only by the reward. Reward
(`ragrl.rewards.knowrl`): format ±1, correctness +2 / +1 (not attempted) / −1, factuality of the
think text against the topic's KB document (`ragrl.factscore`), added to every sample
(`fact_mode: additive`, the paper) or only to wrong ones (`wrong_only`, KnowRL's code). The topic
of a question is its metadata's `topic_entity` (the world's factual split) or `title` (KnowRL's
RL data); a question without one, or whose topic the KB lacks, gets factuality 0 (logged), never
an error.

Options (`recipes.<name>.options`): the KB, the fact mode, the factuality backend (`embedded`:
the world's templates; `paper`: an OpenAI-compatible endpoint with NLI or LLM verification) and
the grader (`em`; `llm`: KnowRL's judge prompt through the endpoint).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ragrl.methods import Method, Score

REWARD_KEYS = ("format", "correct", "fact")
FACT_MODES = ("additive", "wrong_only")
BACKENDS = ("embedded", "paper")
GRADERS = ("em", "llm")
VERIFIERS = ("nli", "llm")
ENDPOINT_KEYS = {"base_url": str, "model": str, "api_key_env": str, "timeout_s": (int, float), "max_retries": int,
                 "max_workers": int, "max_tokens": int}
EVAL_COLUMNS = ("correct", "incorrect", "not_attempted", "format_ok")

# KnowRL's system prompt (train/main.py, generate_prompt), with the question appended as the
# user turn there; here one prompt text with {question}.
INSTRUCTION = (
    "Answer this question using the following format strictly:\n\n1. First use <think> </think> tags to show "
    "your step-by-step reasoning process.\n2. Then use <answer> </answer> tags for your final answer. Use your "
    "factual knowledge to iteratively verify your reasoning and derive the answer. If you genuinely do not know "
    "the answer, you can reply exactly with: I don't know.\nQuestion: {question}\n"
)


@dataclass(frozen=True)
class KnowRLOptions:
    kb: str = "results/kb/world/knowledge_base.db"  # a KnowRL SQLite KB (rule kb)
    fact_mode: str = "additive"
    factscore: str = "embedded"
    grader: str = "em"
    gamma: int = 10  # length-penalty horizon (KnowRL: 10)
    think_prefilled: bool = False  # the prompt ends with <think> (KnowRL's template prefills it)
    # paper backend / LLM grader: {base_url, model, api_key_env, timeout_s, max_retries, max_workers, max_tokens}
    endpoint: dict = field(default_factory=dict)
    verifier: str = "nli"
    nli_model: str = "MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli"
    nli_threshold: float = 0.3
    ranker_model: str | None = "sentence-transformers/gtr-t5-large"
    top_k: int = 5
    prompts_dir: str | None = None  # default resources/knowrl/prompts

    def __post_init__(self) -> None:
        for name, allowed in (("fact_mode", FACT_MODES), ("factscore", BACKENDS), ("grader", GRADERS),
                              ("verifier", VERIFIERS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected one of {allowed}")
        if self.gamma < 1 or self.top_k < 1 or not 0.0 <= self.nli_threshold <= 1.0:
            raise ValueError(f"gamma={self.gamma} and top_k={self.top_k} must be >= 1, nli_threshold="
                             f"{self.nli_threshold} in [0, 1]")
        if not isinstance(self.endpoint, dict):
            raise ValueError(f"endpoint: expected a mapping, got {self.endpoint!r}")
        for k, v in self.endpoint.items():
            if k not in ENDPOINT_KEYS:
                raise ValueError(f"endpoint.{k}: unknown setting; known: {sorted(ENDPOINT_KEYS)}")
            if not isinstance(v, ENDPOINT_KEYS[k]) or isinstance(v, bool):
                raise ValueError(f"endpoint.{k}: wrong type {type(v).__name__}")
        needs_endpoint = self.factscore == "paper" or self.grader == "llm"
        if needs_endpoint and not {"base_url", "model"} <= set(self.endpoint):
            raise ValueError("factscore: paper and grader: llm need endpoint: {base_url, model}")


# One scorer (and its fact / verdict caches) per distinct options, built on first use: the caches
# then live as long as the training job, and two recipes never share one.
_SCORERS: dict[str, Any] = {}


def _key(options: KnowRLOptions) -> str:
    return json.dumps(dataclasses.asdict(options), sort_keys=True)


def endpoint_of(options: KnowRLOptions):
    from ragrl.factscore.paper import ChatEndpoint

    ep = dict(options.endpoint)
    api_key = os.environ.get(ep.pop("api_key_env")) if "api_key_env" in ep else None
    return ChatEndpoint(ep.pop("base_url"), ep.pop("model"), api_key=api_key, **ep)


def fact_scorer(options: KnowRLOptions):
    key = _key(options)
    if key not in _SCORERS:
        if options.factscore == "embedded":
            from ragrl.factscore.embedded import EmbeddedFactScorer

            _SCORERS[key] = EmbeddedFactScorer(options.kb, options.gamma)
        else:
            from ragrl.factscore.paper import DenseRanker, NLIModel, PaperFactScorer

            _SCORERS[key] = PaperFactScorer(
                options.kb, endpoint_of(options),
                entailment=NLIModel(options.nli_model) if options.verifier == "nli" else None,
                threshold=options.nli_threshold,
                ranker=DenseRanker(options.ranker_model) if options.ranker_model else None,
                top_k=options.top_k, gamma=options.gamma, prompts_dir=options.prompts_dir)
    return _SCORERS[key]


def grader(options: KnowRLOptions):
    """grade_many([(question, golds, answer)]) -> grades."""
    if options.grader == "em":
        return _EMGrader()
    key = "grader:" + _key(options)
    if key not in _SCORERS:
        from ragrl.factscore.paper import LLMGrader

        _SCORERS[key] = LLMGrader(endpoint_of(options), options.prompts_dir)
    return _SCORERS[key]


class _EMGrader:
    @staticmethod
    def grade_many(items) -> list[str]:
        from ragrl.rewards.knowrl import em_grade

        return [em_grade(answer, golds) for _, golds, answer in items]


def topic_of(row: Mapping[str, Any]) -> str | None:
    meta = row.get("metadata") or "{}"
    try:
        meta = json.loads(meta) if isinstance(meta, str) else dict(meta)
    except (ValueError, TypeError):
        return None
    if not isinstance(meta, dict):
        return None
    for key in ("topic_entity", "title"):
        if isinstance(meta.get(key), str) and meta[key].strip():
            return meta[key]
    return None


def score_texts(options: KnowRLOptions, weights: Mapping[str, float],
                samples: list[tuple[Mapping[str, Any], str]]) -> list[tuple[float, dict[str, float]]]:
    """(reward, components) per (QA row, completion); facts and grades go out in one batch."""
    from ragrl.rewards.knowrl import answer_text, format_reward, knowrl_reward, think_text

    texts = [t if isinstance(t, str) else "" for _, t in samples]
    grades = grader(options).grade_many([(str(row.get("question", "")), [str(g) for g in row.get("golden_answers") or []],
                                          answer_text(t)) for (row, _), t in zip(samples, texts)])
    topics = [topic_of(row) for row, _ in samples]
    scorer = fact_scorer(options)
    with_topic = [i for i, topic in enumerate(topics) if topic is not None]
    facts = dict(zip(with_topic, scorer.score_many([(topics[i], think_text(texts[i])) for i in with_topic])))
    out = []
    for i, text in enumerate(texts):
        fs = facts.get(i)
        fact_parts = {"n_facts": float(fs.n_facts if fs else 0), "fact_precision": fs.precision if fs else 0.0,
                      "fact_missing_topic": float(fs is None or fs.missing_topic)}
        out.append(knowrl_reward(format_reward(text, options.think_prefilled), grades[i], fs.score if fs else 0.0,
                                 fact_mode=options.fact_mode, weights=weights, fact_components=fact_parts))
    return out


def make_environment(recipe, backends: Mapping[str, Any]):
    from ragrl.agent.environments import ClosedBookEnvironment

    return ClosedBookEnvironment()


def score(recipe, trajectory, row: Mapping[str, Any]) -> Score:
    options = recipe.options if recipe.options is not None else KnowRLOptions()
    reward, components = score_texts(options, recipe.reward, [(row, trajectory.response_text)])[0]
    return Score(reward, None, components)


def eval_rollout(cfg):
    # One turn that must end in <answer>: no tool turns, no <answer> prefilled (the think comes first).
    instruction = cfg.instruction if cfg.instruction is not None else INSTRUCTION
    return dataclasses.replace(cfg, max_turns=0, forced_answer_prefill=False, instruction=instruction)


def eval_metrics(row: dict, trajectory) -> dict[str, float]:
    """SimpleQA's grade of the answer by exact match (the rates are means of these) and the format.
    Fact precision needs the recipe's KB, which this hook is not given (docs/KNOWRL.md)."""
    from ragrl.rewards.knowrl import answer_text, em_grade, format_reward

    text = getattr(trajectory, "response_text", "")
    grade = em_grade(answer_text(text), [str(g) for g in row.get("golden_answers") or []])
    return {"correct": float(grade == "correct"), "incorrect": float(grade == "incorrect"),
            "not_attempted": float(grade == "not_attempted"), "format_ok": float(format_reward(text) > 0)}


METHOD = Method(
    name="knowrl",
    summary="KnowRL: single-turn think/answer; format + correctness/refusal + KB factuality of the think text",
    make_environment=make_environment,
    score=score,
    reward_keys=REWARD_KEYS,
    default_reward={"format": 1.0, "correct": 1.0, "fact": 1.0},
    options=KnowRLOptions,
    eval_metrics=eval_metrics,
    eval_metric_columns=EVAL_COLUMNS,
    eval_rollout=eval_rollout,
)
