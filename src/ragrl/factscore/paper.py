"""The paper backend: KnowRL's FActScore with an OpenAI-compatible endpoint (vLLM or a hosted API).

As KnowRL (train/reward_function/fact_reward.py, factscore/factscorer.py at zjunlp/KnowRL HEAD):
- atomic facts: one chat request per text with KnowRL's prompt (resources/knowrl/prompts/
  atomic_facts.txt); lines starting with "- " are facts, facts under 3 words are dropped, duplicates
  (case-insensitive) dropped, a NON_FACTUAL reply means no facts;
- evidence: the topic document's passages ranked by a dense encoder for "<topic> <fact>", top 5
  (theirs: gtr-t5-large; the encoder is a setting);
- verification: an NLI model (theirs: MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli), a fact is
  supported when some top passage entails it with probability >= 0.3; or the LLM with KnowRL's
  True/False prompt (verify.txt) and their reading of the reply;
- the correctness grade: KnowRL's SimpleQA-style judge prompt (grader.txt), "A"/"B"/"C" (or the
  words) read as theirs.

Differences, all about failure: requests go out concurrently (`max_workers`), transient failures
are retried with backoff, and an endpoint still failing raises `EndpointUnavailable` (KnowRL's
judge returns 0 and its fact scorer zeroes the whole batch on any exception). A reply without text
is asked again, then raises; a reply in the wrong format (no fact list, no True/False, no grade)
keeps KnowRL's reading but is counted and logged, and a run of them raises (ragrl.replies). A text
without a non-blank line has no facts, without a request. Prompt templates are filled by name in
one pass, so model text is never read as a template.
"""

from __future__ import annotations

import concurrent.futures
import re
import string
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from ragrl.agent.protocol import split_blocks
from ragrl.errors import InputError, RagrlError
from ragrl.factscore.core import FactScorer, FactVerdict
from ragrl.replies import DEAD_RUN, ReplyTally

PROMPTS = Path(__file__).resolve().parents[3] / "resources" / "knowrl" / "prompts"
GRADES = ("correct", "incorrect", "not_attempted", "unparsed")


class EndpointError(RagrlError, RuntimeError):
    """The endpoint answered with something that is not a chat completion."""


class EndpointUnavailable(EndpointError):
    """The endpoint did not answer after every retry."""


def load_prompt(name: str, prompts_dir: str | Path | None = None) -> str:
    path = Path(prompts_dir or PROMPTS) / name
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path}: no such file")
    return path.read_text()


def fill(template: str, **values: str) -> str:
    """Replace `{name}` for the given names only, in one pass (inserted text is not re-scanned, and
    other braces in the template stay as written)."""
    pattern = re.compile("|".join(re.escape("{" + k + "}") for k in values)) if values else None
    return pattern.sub(lambda m: str(values[m.group(0)[1:-1]]), template) if pattern else template


class ChatEndpoint:
    """POST {base_url}/v1/chat/completions, one prompt per request, `max_workers` at a time."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 60.0,
                 max_retries: int = 3, backoff_s: float = 1.0, max_backoff_s: float = 30.0, max_workers: int = 8,
                 max_tokens: int = 512, temperature: float = 0.0, transport: httpx.BaseTransport | None = None) -> None:
        from ragrl.http_retry import api_url

        self.url = api_url(base_url, "chat/completions")
        self.model = model
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.max_workers = max(1, max_workers)
        self.max_tokens, self.temperature = max_tokens, temperature
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)
        self.requests = 0

    def close(self) -> None:
        self.client.close()

    def complete(self, prompts: Sequence[str]) -> list[str]:
        """The reply text per prompt, in order."""
        if len(prompts) <= 1:
            return [self._one(p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(min(self.max_workers, len(prompts))) as pool:
            return list(pool.map(self._one, prompts))

    def _one(self, prompt: str) -> str:
        from ragrl.replies import chat_text

        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": self.temperature, "max_tokens": self.max_tokens}
        self.requests += 1
        return chat_text(self.client, self.url, body, retries=self.max_retries, backoff=self.backoff_s,
                         max_backoff=self.max_backoff_s, rejected=EndpointError, unavailable=EndpointUnavailable,
                         service="chat endpoint")

    def tally(self, role: str, reading: str, dead_run: int | None = DEAD_RUN, log=None) -> ReplyTally:
        return ReplyTally(role, self.url, EndpointError, reading, dead_run, log)


# --------------------------------------------------------------------------- reading replies


def facts_stated(reply: str) -> bool:
    """Whether a fact-extraction reply is in the prompt's format: a "- " list or NON_FACTUAL."""
    return "NON_FACTUAL:" in reply or any(line.strip().startswith("- ") for line in reply.split("\n"))


def verdict_stated(reply: str) -> bool:
    """Whether a verification reply says True or False (else KnowRL's keyword fallback reads it)."""
    return "true" in reply.lower() or "false" in reply.lower()


def parse_atomic_facts(reply: str) -> list[str]:
    """KnowRL's `parse_atomic_facts_response`; a NON_FACTUAL reply (or none) gives no facts."""
    if not reply or "NON_FACTUAL:" in reply:
        return []
    facts, seen = [], set()
    for line in reply.strip().split("\n"):
        line = line.strip()
        if line.startswith("- "):
            fact = line[2:].strip()
            if len(fact.split()) >= 3 and fact.lower() not in seen:
                seen.add(fact.lower())
                facts.append(fact)
    return facts


_CORRECT = re.compile(r"\b(CORRECT|A)\b")
_INCORRECT = re.compile(r"\b(INCORRECT|B)\b")
_NOT_ATTEMPTED = re.compile(r"\b(NOT_ATTEMPTED|NOT ATTEMPTED|C)\b")


def parse_grade(reply: str) -> str:
    """KnowRL's reading of the judge (correct_reward.py): inside <ANSWER>…</ANSWER> if present,
    else the whole reply; CORRECT/A before INCORRECT/B before NOT_ATTEMPTED/C; else unparsed."""
    text = (reply or "").strip().upper()
    tagged = split_blocks(text, "<ANSWER>", "</ANSWER>")[1:2]
    for part in [t.strip() for t in tagged] + [text]:
        for grade, pattern in (("correct", _CORRECT), ("incorrect", _INCORRECT), ("not_attempted", _NOT_ATTEMPTED)):
            if pattern.search(part):
                return grade
    return "unparsed"


def parse_verdict(reply: str) -> bool:
    """KnowRL's reading of the True/False verifier (factscorer.py `_get_score`, LLM path)."""
    answer = (reply or "").lower()
    if "true" in answer or "false" in answer:
        if "true" in answer and "false" not in answer:
            return True
        if "false" in answer and "true" not in answer:
            return False
        return answer.index("true") < answer.index("false")
    words = answer.translate(str.maketrans("", "", string.punctuation)).split()
    return all(k not in words for k in ("not", "cannot", "unknown", "information"))


# --------------------------------------------------------------------------- evidence and verifiers


class DenseRanker:
    """Passages of a topic ranked for "<topic> <fact>" by a sentence-transformers encoder (KnowRL:
    gtr-t5-large); passage vectors computed once per topic."""

    def __init__(self, model: str, device: str | None = None) -> None:
        from ragrl.models import check_model

        self.model_name, self.device = model, device
        self.path = check_model(model, "factscore ranker")  # loaded on first use: checked now
        self._encoder = None
        self._vectors: dict[str, object] = {}

    def _load(self):
        if self._encoder is None:
            from sentence_transformers import SentenceTransformer

            self._encoder = SentenceTransformer(self.path, device=self.device)
        return self._encoder

    def top(self, topic: str, fact: str, passages: Sequence[tuple[str, str]], k: int) -> list[int]:
        if len(passages) <= k:
            return list(range(len(passages)))
        import numpy as np

        encoder = self._load()
        if topic not in self._vectors:
            self._vectors[topic] = encoder.encode([f"{t} {p}" for t, p in passages], show_progress_bar=False)
        query = encoder.encode([f"{topic} {fact.strip()}"], show_progress_bar=False)[0]
        scores = np.inner(query, self._vectors[topic])
        return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


class NLIModel:
    """P(entailment) of (premise, hypothesis) pairs from an HF sequence classifier (KnowRL:
    MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli)."""

    def __init__(self, model: str, device: str | None = None, batch_size: int = 32) -> None:
        from ragrl.models import check_model

        self.model_name, self.device, self.batch_size = model, device, batch_size
        self.path = check_model(model, "factscore nli_model")  # loaded on first use: checked now
        self._loaded: tuple | None = None

    def _load(self):
        if self._loaded is None:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(self.path)
            model = AutoModelForSequenceClassification.from_pretrained(self.path).eval()
            device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
            labels = {str(v).upper(): int(k) for k, v in model.config.id2label.items()}
            if "ENTAILMENT" not in labels:
                raise InputError(f"NLI model {self.model_name}: no ENTAILMENT label in {sorted(labels)}")
            self._loaded = (tok, model.to(device), device, labels["ENTAILMENT"])
        return self._loaded

    def __call__(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        import torch

        tok, model, device, entail = self._load()
        out: list[float] = []
        for i in range(0, len(pairs), self.batch_size):
            chunk = pairs[i:i + self.batch_size]
            enc = tok([p for p, _ in chunk], [h for _, h in chunk], return_tensors="pt", padding=True,
                      truncation=True, max_length=512).to(device)
            with torch.no_grad():
                probs = torch.softmax(model(**enc).logits.float(), dim=-1)[:, entail]
            out += [float(p) for p in probs.cpu()]
        return out


Entailment = Callable[[Sequence[tuple[str, str]]], list[float]]


class PaperFactScorer(FactScorer):
    """Facts from the endpoint; verified by NLI (`entailment` given) or by the LLM (None)."""

    def __init__(self, kb, endpoint: ChatEndpoint, *, entailment: Entailment | None = None, threshold: float = 0.3,
                 ranker: DenseRanker | None = None, top_k: int = 5, gamma: int = 10, prompts_dir=None,
                 log=None) -> None:
        super().__init__(kb, gamma, log)
        self.endpoint, self.entailment, self.threshold = endpoint, entailment, threshold
        self.ranker, self.top_k = ranker, top_k
        self.fact_prompt = load_prompt("atomic_facts.txt", prompts_dir)
        self.verify_prompt = load_prompt("verify.txt", prompts_dir)
        self.replies = {"extract": endpoint.tally("fact extraction", "no facts", log=self.log),
                        "verify": endpoint.tally("fact verification", "KnowRL's keyword rule", log=self.log)}

    @property
    def offformat(self) -> dict[str, int]:
        return {k: t.offformat for k, t in self.replies.items()}

    def require_usable_replies(self) -> None:
        for tally in self.replies.values():
            tally.require_usable()

    def extract(self, texts: Sequence[str]) -> list[list[str]]:
        # KnowRL's input: non-empty lines joined by blank lines.
        lines = [[ln.strip() for ln in t.split("\n") if ln.strip()] for t in texts]
        asked = [i for i, ls in enumerate(lines) if ls]
        replies = self.endpoint.complete([fill(self.fact_prompt, text="\n\n".join(lines[i])) for i in asked])
        self.replies["extract"].record([facts_stated(r) for r in replies])
        facts: list[list[str]] = [[] for _ in texts]
        for i, reply in zip(asked, replies):
            facts[i] = parse_atomic_facts(reply)
        return facts

    def _evidence(self, topic: str, fact: str, passages: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        # Without an encoder every passage is evidence (a world document is one passage anyway).
        if self.ranker is None or len(passages) <= self.top_k:
            return list(passages)
        return [passages[i] for i in self.ranker.top(topic, fact, passages, self.top_k)]

    def verify(self, topic: str, facts: Sequence[str], passages: Sequence[tuple[str, str]]) -> list[FactVerdict]:
        evidence = [self._evidence(topic, f, passages) for f in facts]
        if self.entailment is not None:
            pairs = [(p, f) for f, ev in zip(facts, evidence) for _, p in ev]
            probs = iter(self.entailment(pairs))
            verdicts = []
            for f, ev in zip(facts, evidence):
                scored = [(next(probs), p) for _, p in ev]
                best = max(scored, default=(0.0, None))
                ok = best[0] >= self.threshold
                verdicts.append(FactVerdict(f, ok, best[1] if ok else None))
            return verdicts
        prompts = [fill(self.verify_prompt, topic=topic, fact=f.strip(),
                        context="\n\n".join(f"[{t}]\n{p}" for t, p in ev)) for f, ev in zip(facts, evidence)]
        replies = self.endpoint.complete(prompts)
        self.replies["verify"].record([verdict_stated(r) for r in replies])
        return [FactVerdict(f, parse_verdict(r), None) for f, r in zip(facts, replies)]


class LLMGrader:
    """KnowRL's judge: correct / incorrect / not_attempted (or unparsed) per (question, gold, answer).
    A missing or empty answer is incorrect without a request, as in KnowRL."""

    def __init__(self, endpoint: ChatEndpoint, prompts_dir=None, dead_run: int | None = DEAD_RUN) -> None:
        self.endpoint = endpoint
        self.prompt = load_prompt("grader.txt", prompts_dir)
        self.replies = endpoint.tally("grader", "unparsed (scores 0)", dead_run)

    def grade_many(self, items: Sequence[tuple[str, Sequence[str], str | None]]) -> list[str]:
        ask = [i for i, (_, _, a) in enumerate(items) if a is not None and a.strip()]
        prompts = [fill(self.prompt, question=items[i][0], answer=str(items[i][2]).strip(),
                        gold_answer=items[i][1][0] if items[i][1] else "No reference answer provided.") for i in ask]
        grades = ["incorrect"] * len(items)
        for i, reply in zip(ask, self.endpoint.complete(prompts)):
            grades[i] = parse_grade(reply)
        self.replies.record([grades[i] != "unparsed" for i in ask])
        return grades
