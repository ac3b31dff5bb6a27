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
import functools
import json
import os
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragrl.errors import InputError
from ragrl.hashing import in_hashed_share
from ragrl.methods import Method, Score

REWARD_KEYS = ("format", "correct", "fact")
FACT_MODES = ("additive", "wrong_only")
BACKENDS = ("embedded", "paper")
GRADERS = ("em", "llm")
VERIFIERS = ("nli", "llm")
ENDPOINT_KEYS = {"base_url": str, "model": str, "api_key_env": str, "timeout_s": (int, float), "max_retries": int,
                 "max_workers": int, "max_tokens": int}
EVAL_COLUMNS = ("correct", "incorrect", "not_attempted", "format_ok", "fact_precision", "n_facts")
REFUSAL = "I don't know"

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
    # The knowledge-boundary toy (docs/KNOWRL.md): the cold-start SFT lets the policy read the KB
    # documents of a `known_share` of the topics, each `read_repeats` times (its sentences in a new
    # order each time), and teaches it to answer from them on known topics and to refuse on the
    # others; evaluation groups questions by known / unknown topic. 0: no reading (the paper's SFT
    # data has none), questions grouped by type.
    known_share: float = 0.5
    read_repeats: int = 0
    question_repeats: int = 1  # copies of each training question's row (so reading does not drown them)
    # Share of the unknown training topics whose questions the SFT data keeps as refusals (by hash):
    # 1.0 asks about every unknown topic as often as about the known ones.
    refusal_share: float = 1.0

    def __post_init__(self) -> None:
        for name, allowed in (("fact_mode", FACT_MODES), ("factscore", BACKENDS), ("grader", GRADERS),
                              ("verifier", VERIFIERS)):
            if getattr(self, name) not in allowed:
                raise InputError(f"{name}={getattr(self, name)!r}: expected one of {allowed}")
        if (not 0.0 <= self.known_share <= 1.0 or not 0.0 <= self.refusal_share <= 1.0 or self.read_repeats < 0
                or self.question_repeats < 1):
            raise InputError(f"known_share={self.known_share} and refusal_share={self.refusal_share} must be in "
                             f"[0, 1], read_repeats={self.read_repeats} >= 0 and question_repeats="
                             f"{self.question_repeats} >= 1")
        if self.gamma < 1 or self.top_k < 1 or not 0.0 <= self.nli_threshold <= 1.0:
            raise InputError(f"gamma={self.gamma} and top_k={self.top_k} must be >= 1, nli_threshold="
                             f"{self.nli_threshold} in [0, 1]")
        if not isinstance(self.endpoint, dict):
            raise InputError(f"endpoint: expected a mapping, got {self.endpoint!r}")
        for k, v in self.endpoint.items():
            if k not in ENDPOINT_KEYS:
                raise InputError(f"endpoint.{k}: unknown setting; known: {sorted(ENDPOINT_KEYS)}")
            if not isinstance(v, ENDPOINT_KEYS[k]) or isinstance(v, bool):
                raise InputError(f"endpoint.{k}: wrong type {type(v).__name__}")
        needs_endpoint = self.factscore == "paper" or self.grader == "llm"
        if needs_endpoint and not {"base_url", "model"} <= set(self.endpoint):
            raise InputError("factscore: paper and grader: llm need endpoint: {base_url, model}")


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


def _metadata(row: Mapping[str, Any]) -> dict:
    """The row's metadata as a mapping ({} when absent or not a JSON object: no topic, no fact term)."""
    from ragrl.data.qa import row_metadata

    try:
        return row_metadata(dict(row))
    except InputError:
        return {}


def topic_of(row: Mapping[str, Any]) -> str | None:
    meta = _metadata(row)
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
    seen = sum(scorer.offformat.values())
    with_topic = [i for i, topic in enumerate(topics) if topic is not None]
    thinks = [(topics[i], think_text(texts[i], options.think_prefilled)) for i in with_topic]
    facts = dict(zip(with_topic, scorer.score_many(thinks)))
    # Spread over the batch's samples, so that the step log's mean times its samples is the step's
    # count (a cached reply serves later samples too, so which sample one belongs to is not kept).
    offformat = (sum(scorer.offformat.values()) - seen) / max(len(samples), 1)
    out = []
    for i, text in enumerate(texts):
        fs = facts.get(i)
        fact_parts = {"n_facts": float(fs.n_facts if fs else 0), "fact_precision": fs.precision if fs else 0.0,
                      "fact_missing_topic": float(fs is None or fs.missing_topic),
                      "fact_offformat_replies": offformat, "grade_unparsed": float(grades[i] == "unparsed")}
        out.append(knowrl_reward(format_reward(text, options.think_prefilled), grades[i], fs.score if fs else 0.0,
                                 fact_mode=options.fact_mode, weights=weights, fact_components=fact_parts))
    return out


def options_of(recipe) -> KnowRLOptions:
    return recipe.options if recipe.options is not None else KnowRLOptions()


def is_known(topic: str, share: float, seed: int = 0) -> bool:
    """Whether the toy policy reads `topic`'s document: a fixed share of topics, by hash, so the
    SFT builder and the evaluation agree without sharing a file."""
    return in_hashed_share(f"{seed}\x00{topic}", share)


def completion(think: str, answer: str) -> str:
    # "<answer> X": the answer in the word pieces the think text wrote it in (ragrl.toy.gold).
    return f"<think>\n{think}\n</think>\n<answer> {answer}</answer>"


def make_environment(recipe, backends: Mapping[str, Any]):
    from ragrl.agent.environments import ClosedBookEnvironment

    # RL, evaluation and gold SFT data make the environment before any rollout: the reward's
    # files (the KB, the NLI and ranker models, the prompts) are opened and checked here, so a
    # damaged one is named now rather than by sqlite or a model loader mid-run.
    options = options_of(recipe)
    fact_scorer(options)
    grader(options)
    return ClosedBookEnvironment()


def single_turn(cfg):
    # One turn that must end in <answer>: no tool turns, no <answer> prefilled (the think comes
    # first), KnowRL's prompt unless the recipe sets one. Applied when a recipe is parsed, so SFT
    # data, RL and evaluation share it.
    instruction = cfg.instruction if cfg.instruction is not None else INSTRUCTION
    return dataclasses.replace(cfg, max_turns=0, forced_answer_prefill=False, instruction=instruction)


def files(recipe) -> dict[str, str]:
    return {"kb": options_of(recipe).kb}


def score(recipe, trajectory, row: Mapping[str, Any]) -> Score:
    reward, components = score_texts(options_of(recipe), recipe.reward, [(row, trajectory.response_text)])[0]
    return Score(reward, None, components)


def gold_sft_reason(dataset: Mapping[str, Any]) -> str | None:
    """Gold think text needs each question's topic and gold answer: the world's factual split."""
    if dataset.get("format") == "parquet" and str(dataset.get("path", "")).startswith("results/world/factual/"):
        return None
    return (f"KnowRL's gold SFT data needs questions with a topic entity in the KB (the world's factual split), "
            f"and dataset {dataset.get('path')!r} is not one; import their cold-start data (sft.source: import)")


def gold_sft(recipe, qa, policy, env, backends, out, limit=None) -> dict:
    """Cold-start SFT data for the knowledge-boundary toy: the KB documents of the known topics
    (read as plain text, the whole text trained), then a question on every fact each training
    topic's document states: on a known topic <think> states the fact and <answer> gives its
    tail; on an unknown one <think> breaks the sentence off and <answer> is "I don't know"."""
    from ragrl.factscore.embedded import sentences
    from ragrl.kb.build import kb_titles, read_document
    from ragrl.toy.relations import RELATION_BY_KEY
    from ragrl.train.sft_data import SFTDataStats, data_engine, read_qa_rows, sft_row, write_sft_data

    options = options_of(recipe)
    engine = data_engine(policy, env, None, recipe.rollout)
    tokenizer = engine.tokenizer
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    rng = random.Random(recipe.seed)
    stats, rows, groups = SFTDataStats("gold"), [], {"known": 0, "unknown": 0, "unknown_topics_skipped": 0}

    @functools.cache  # a known training topic's document is read, then asked about
    def document(topic: str) -> tuple[str, ...]:
        return tuple(s for passage in read_document(options.kb, topic) or [] for s in sentences(passage))

    read = [t for t in kb_titles(options.kb) if is_known(t, options.known_share, recipe.seed)] \
        if options.read_repeats else []
    for title in read:
        facts = list(document(title))
        for r in range(options.read_repeats):
            rng.shuffle(facts)
            ids = tokenizer.encode(" ".join(facts), add_special_tokens=False) + eos
            rows.append(sft_row(f"read-{title}-{r}", ids, [1] * len(ids), 0, tokenizer))
    # Every fact the documents state about each training topic becomes a question (the row's own
    # wording for its fact, a template's for the others): the toy's split has ~1 question per
    # topic, too few to learn which fact a question asks for.
    asked: dict[str, dict[str, str]] = {}
    for row in read_qa_rows(qa, limit):
        stats.total += 1
        topic, hop = topic_of(row), _hop(row)
        if topic is None or hop is None:
            stats.dropped["no_topic_or_hop"] += 1
            continue
        asked.setdefault(topic, {})[hop[1]] = str(row["question"])
        stats.kept += 1
    for topic, own in asked.items():
        known = is_known(topic, options.known_share, recipe.seed)
        if not known and not in_hashed_share(f"refusal\x00{recipe.seed}\x00{topic}", options.refusal_share):
            groups["unknown_topics_skipped"] += 1
            continue
        facts = document(topic)
        for relation, tail, stated, prefix in _stated_facts(topic, facts, prefer=own):
            question = own.get(relation) or rng.choice(RELATION_BY_KEY[relation].questions).format(h=topic)
            # The think states the asked fact as the documents do, so whether the policy knows the
            # topic is decided where it recalls the answer, not before the first word: a known
            # topic's fact completed, an unknown one broken off.
            think = stated if known else f"{prefix} ... I have not read about {topic}."
            prompt = engine.prompt_ids(question)
            reply = tokenizer.encode(completion(think, tail if known else REFUSAL), add_special_tokens=False) + eos
            if len(reply) > recipe.rollout.max_turn_tokens:
                stats.dropped["turn_too_long"] += 1
                continue
            groups["known" if known else "unknown"] += 1
            rows += [sft_row(f"{topic}/{relation}", prompt + reply, [0] * len(prompt) + [1] * len(reply), 1,
                             tokenizer)] * options.question_repeats
    write_sft_data(rows, stats, out)
    print(f"[sft-data] knowrl: {len(read)} known documents read x{options.read_repeats}; {len(asked)} topics, "
          f"{groups['known'] + groups['unknown']} questions ({groups['known']} known / {groups['unknown']} unknown, "
          f"{groups['unknown_topics_skipped']} unknown topics not asked) x{options.question_repeats}; "
          f"{stats.to_dict()}", file=sys.stderr, flush=True)
    return {**stats.to_dict(), "documents_read": len(read), "read_rows": len(read) * options.read_repeats, **groups}


def _hop(row: Mapping[str, Any]) -> list | None:
    """The question's fact [head, relation, tail] (metadata hops)."""
    hops = _metadata(row).get("hops")
    hop = hops[0] if isinstance(hops, list) and hops else None
    return hop if isinstance(hop, list) and len(hop) == 3 else None


def _stated_facts(topic: str, sentences: Sequence[str], prefer=()) -> list[tuple[str, str, str, str]]:
    """(relation, tail, the sentence, the sentence up to the tail) for each sentence of a topic's
    document that the world's canonical template of a relation reads, case kept; where two
    relations share a template (a company's and a university's founding year), one in `prefer`."""
    import re

    from ragrl.toy.relations import RELATIONS

    out = []
    for sentence in sentences:
        found = []
        for rel in RELATIONS:
            head_part, tail_part = rel.sentences[0].split("{t}")
            m = re.fullmatch(re.escape(head_part.format(h=topic)) + "(?P<t>.+?)" + re.escape(tail_part.format(h=topic)),
                             sentence)
            if m:
                found.append((rel.key, m.group("t"), sentence, sentence[:m.start("t")].rstrip()))
        if found:  # the most literal template: "born in the year {t}" over "born in {t}"
            out.append(min(found, key=lambda f: (len(f[1]), f[0] not in prefer)))
    return out


def eval_group(recipe, row: Mapping[str, Any]) -> str | None:
    """known / unknown topic in the toy (the policy read its document or not); else the row's type."""
    options = options_of(recipe)
    topic = topic_of(row)
    if not options.read_repeats or topic is None:
        return None
    return "known" if is_known(topic, options.known_share, recipe.seed) else "unknown"


def eval_metrics(recipe, row: dict, trajectory) -> dict[str, float | None]:
    """SimpleQA's three grades of the answer by exact match (the rates are their means), the
    format, and the fact precision of the think text against the topic's KB document: the
    precision of the claims an answer rests on, so None (left out of the mean) for a refusal, a
    think stating no fact, or a question without a topic."""
    from ragrl.rewards.knowrl import answer_text, em_grade, format_reward, think_text

    options = options_of(recipe)
    text = getattr(trajectory, "response_text", "")
    text = text if isinstance(text, str) else ""
    grade = em_grade(answer_text(text), [str(g) for g in row.get("golden_answers") or []])
    topic = topic_of(row)
    facts = fact_scorer(options).score(topic, think_text(text, options.think_prefilled)) if topic is not None else None
    n_facts = facts.n_facts if facts is not None and not facts.missing_topic else 0
    return {"correct": float(grade == "correct"), "incorrect": float(grade == "incorrect"),
            "not_attempted": float(grade == "not_attempted"),
            "format_ok": float(format_reward(text, options.think_prefilled) > 0),
            "fact_precision": facts.precision if n_facts and grade != "not_attempted" else None,
            "n_facts": float(n_facts)}


METHOD = Method(
    name="knowrl",
    summary="KnowRL: single-turn think/answer; format + correctness/refusal + KB factuality of the think text",
    make_environment=make_environment,
    score=score,
    reward_keys=REWARD_KEYS,
    default_reward={"format": 1.0, "correct": 1.0, "fact": 1.0},
    options=KnowRLOptions,
    gold_sft=gold_sft,
    gold_sft_reason=gold_sft_reason,
    eval_metrics=eval_metrics,
    eval_metric_columns=EVAL_COLUMNS,
    eval_group=eval_group,
    rollout=single_turn,
    files=files,
    own_baseline=True,
)
