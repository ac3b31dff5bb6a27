"""Pretraining the tiny policy to read: language modelling on synthetic text with fresh names.

Real R1-style methods start from a pretrained LM that can already copy a name out of its context.
A randomly initialised tiny policy cannot, and SFT on a few hundred gold trajectories does not
teach it (it memorises training names instead). This stage gives the tiny policy that ability
before any recipe sees it, on text that no evaluation question depends on:

* The corpus is a stream of small synthetic worlds (`ragrl.toy.world.generate_world`, seeds of
  their own), each with freshly invented names, none of them a name of the evaluation world
  (its names are reserved in every pretraining world's name generator, and every example is
  checked word by word against them; `check_corpus`). A name occurs in a handful of examples of
  one world only, so memorising does not lower the loss; reading does.
* Examples are reading-comprehension texts in the layout the agent sees: the retrieved
  passages as Search-R1 shows them (`Doc i(Title: …) …`, the supporting passages among
  distractors, shuffled), then `Question: …` and `Answer: …`. No chat template and no protocol
  tags: the base model reads; the recipes' SFT teaches it the protocol.
* The tokenizer is trained on this corpus too, not on the evaluation world, so every piece an
  evaluation name is split into was seen (often) during pretraining; a tokenizer trained on the
  evaluation world turns its names into whole-word tokens that only its test questions contain,
  whose embeddings no training ever touches.

Training is a plain PyTorch loop (AdamW, warmup + cosine), on packed rows (whole examples joined
by `<|endoftext|>`, as many as fit in `seq_len`), with a reading probe: greedy answers
to held-out questions of the evaluation world given their supporting passages, exact match.
Output: the model in HF format (what `ragrl.toy.tiny_model` writes) plus `pretrain_log.jsonl`
(one record per logged step: loss, lr, tokens; probe EM where measured).
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch

from ragrl.agent.protocol import format_docs
from ragrl.errors import InputError
from ragrl.hostinfo import segment, training_record, write_record
from ragrl.io import atomic_dir, write_json
from ragrl.paths import SPLITS
from ragrl.toy.relations import RELATION_BY_KEY, RELATIONS
from ragrl.toy.world import WORLD_VERSION, generate_world

# The evaluation world is seeded by the user (13 by default); pretraining worlds use seeds far
# from any seed a config is likely to name, although reserved names already keep them apart.
WORLD_SEED_BASE = 1_000_003
_WORD_RE = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class PretrainArgs:
    steps: int = 600
    batch_size: int = 4  # rows per step
    seq_len: int = 512  # tokens per row (whole examples only; most are 110-420 tokens)
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # the cosine schedule ends at lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    world_people: int = 50  # people per pretraining world; each world brings fresh names
    distractors: int = 1  # random passages of the same world shown with the supporting ones
    mix_worlds: int = 20  # worlds whose examples are shuffled together (1: one world after another)
    tokenizer_worlds: int = 200  # worlds the tokenizer is trained on (a few examples from each)
    answer_only_loss: bool = False  # loss on the answer span only (else on every token)
    # Answer tokens weigh this much more than the text around them: reading is the point, and an
    # answer is a few tokens among hundreds of passage tokens.
    answer_weight: float = 5.0
    # The curriculum: this share of examples are fact lists (1..max_facts one-sentence facts in the
    # world's templates, then a question on one of them). Short lists make the lookup easy, so the
    # copy circuit forms in a few hundred steps; on passages alone it had not formed after 600
    # (docs/READING.md). The rest are passage-reading examples of `reading_types` questions.
    fact_share: float = 0.7
    max_facts: int = 6
    # Name lists to repeat verbatim ("List: A, B.\nRepeat: A, B."), added on top of the above at
    # this share of the stream: pure copying forms induction heads in ~100 steps on this model,
    # and a lookup needs them to copy the rest of a name once its first piece is found.
    copy_share: float = 0.0
    reading_types: tuple[str, ...] = ("1hop",)
    log_every: int = 10
    eval_every: int = 250  # reading probe every N steps (0: only at the end)
    eval_questions: int = 100
    threads: int | None = None  # torch threads; None leaves torch's default

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "lr", "log_every", "world_people"):
            if getattr(self, name) <= 0:
                raise InputError(f"pretrain.{name}={getattr(self, name)} must be > 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise InputError(f"pretrain.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.mix_worlds < 1:
            raise InputError(f"pretrain.mix_worlds={self.mix_worlds} must be >= 1")
        if self.distractors < 0 or self.eval_every < 0 or self.eval_questions < 0:
            raise InputError("pretrain.distractors, eval_every and eval_questions must be >= 0")
        if not 0 <= self.fact_share <= 1:
            raise InputError(f"pretrain.fact_share={self.fact_share} must be in [0, 1]")
        if not 0 <= self.copy_share < 1:
            raise InputError(f"pretrain.copy_share={self.copy_share} must be in [0, 1)")
        if self.max_facts < 1 or self.answer_weight <= 0:
            raise InputError("pretrain.max_facts must be >= 1 and pretrain.answer_weight > 0")
        # JSON settings give a list; the dataclass is frozen and hashable, so keep a tuple.
        object.__setattr__(self, "reading_types", tuple(self.reading_types))
        unknown = set(self.reading_types) - {"1hop", "bridge", "comparison"}
        if unknown or not self.reading_types:
            raise InputError(f"pretrain.reading_types={list(self.reading_types)}: choose from 1hop, bridge, comparison")


# --------------------------------------------------------------------------- names to keep out


def world_names(world_dir: str | Path) -> list[str]:
    """Every entity name and alias of a written world (the names pretraining must not contain)."""
    t = pq.read_table(Path(world_dir) / "entities.parquet", columns=["name", "aliases"]).to_pydict()
    names = list(t["name"])
    for aliases in t["aliases"]:
        names += list(aliases or [])
    return sorted(set(names))


class NameFilter:
    """Finds names inside a text as whole words (`Velmar` in "Port Velmar", not in "Velmarholm")."""

    def __init__(self, names: Iterable[str]) -> None:
        grams = {tuple(_WORD_RE.findall(n)) for n in names} - {()}
        # first word → the lengths of the names that start with it (most words start none)
        self._lengths: dict[str, set[int]] = {}
        for g in grams:
            self._lengths.setdefault(g[0], set()).add(len(g))
        self._grams = grams

    def find(self, text: str) -> str | None:
        """The first listed name that occurs in `text`, or None."""
        words = _WORD_RE.findall(text)
        for i, word in enumerate(words):
            for n in self._lengths.get(word, ()):
                gram = tuple(words[i : i + n])
                if gram in self._grams:
                    return " ".join(gram)
        return None


# --------------------------------------------------------------------------- the corpus


def reading_prompt(docs: Sequence[dict], question: str) -> str:
    """What the model reads before answering: passages as the search environment shows them, the question."""
    return f"{format_docs(docs)}Question: {question}\nAnswer:"


def reading_examples(world, rng: random.Random, distractors: int,
                     types: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(prompt, answer) for every question of `world` (all splits: its names are all fresh), of
    the question `types` given (all by default)."""
    by_id = {p["id"]: p for p in world.passages}
    out = []
    for split in SPLITS:
        for row in world.qa[split]:
            if types is not None and json.loads(row["metadata"]).get("type", "") not in types:
                continue
            support = [by_id[i] for i in row["supporting_ids"]]
            docs = support + rng.sample(world.passages, distractors)
            rng.shuffle(docs)
            out.append((reading_prompt(docs, row["question"]), " " + row["golden_answers"][0]))
    rng.shuffle(out)
    return out


def fact_examples(world, rng: random.Random, max_facts: int) -> list[tuple[str, str]]:
    """As many fact-list examples as `world` has facts: 1..`max_facts` facts, each one sentence
    in one of its relation's templates, then a question on one of them (never an ambiguous one)."""
    name = {e.id: e.name for e in world.entities.values()}
    facts = world.facts
    out = []
    for _ in range(len(facts)):
        chosen = rng.sample(facts, min(len(facts), rng.randint(1, max_facts)))
        asked = rng.choice(chosen)
        if sum(f.head == asked.head and f.relation == asked.relation for f in chosen) > 1:
            continue
        sentences = [rng.choice(RELATION_BY_KEY[f.relation].sentences).format(h=name.get(f.head, f.head),
                                                                              t=name.get(f.tail, f.tail))
                     for f in chosen]
        question = rng.choice(RELATION_BY_KEY[asked.relation].questions).format(h=name[asked.head])
        out.append((f"{' '.join(sentences)}\nQuestion: {question}\nAnswer:", " " + name.get(asked.tail, asked.tail)))
    return out


def world_examples(world, rng: random.Random, args: "PretrainArgs") -> list[tuple[str, str]]:
    """One world's share of the curriculum: its fact lists and passage readings, `fact_share` of
    the result being fact lists (as far as the world has examples of each)."""
    facts = fact_examples(world, rng, args.max_facts) if args.fact_share > 0 else []
    reading = reading_examples(world, rng, args.distractors, args.reading_types) if args.fact_share < 1 else []
    if facts and reading:
        want_reading = round(len(facts) * (1 - args.fact_share) / args.fact_share)
        if want_reading <= len(reading):
            reading = reading[:want_reading]
        else:
            facts = facts[: round(len(reading) * args.fact_share / (1 - args.fact_share))]
    examples = facts + reading
    if args.copy_share > 0:
        examples += copy_examples(rng, round(len(examples) * args.copy_share / (1 - args.copy_share)))
    return examples


def copy_examples(rng: random.Random, n: int, max_items: int = 5) -> list[tuple[str, str]]:
    """`n` lists of 1..`max_items` fresh names of mixed types, to be repeated verbatim."""
    from ragrl.toy.names import NameFactory

    names = NameFactory(rng)
    makers = (names.person, names.city, names.country, names.company, names.film)
    out = []
    for _ in range(n):
        items = ", ".join(rng.choice(makers)() for _ in range(rng.randint(1, max_items)))
        out.append((f"List: {items}.\nRepeat:", f" {items}."))
    return out


def corpus_worlds(seed: int, people: int, reserved: Sequence[str]) -> Iterator:
    """Pretraining worlds, one after another, forever; none hands out a `reserved` name."""
    k = 0
    while True:
        yield generate_world(WORLD_SEED_BASE * (seed + 1) + k, people, reserved=reserved)
        k += 1


def corpus_examples(seed: int, people: int, distractors: int, reserved: Sequence[str],
                    mix_worlds: int = 1, args: "PretrainArgs | None" = None) -> Iterator[tuple[str, str]]:
    """The example stream: (prompt, answer) pairs from successive fresh worlds, the examples of
    `mix_worlds` worlds at a time shuffled together (a world's names then recur far apart, so
    remembering them from one example to the next pays less than reading them).

    No pretraining world hands out a `reserved` name, but a fresh name may still contain one as a
    word ("Lake Troupu" holds the alias "Troupu"): such examples are skipped.
    """
    rng = random.Random(seed)
    name_filter = NameFilter(reserved)
    worlds = corpus_worlds(seed, people, reserved)
    while True:
        pool = [ex for _ in range(mix_worlds)
                for ex in (world_examples(next(worlds), rng, args) if args is not None
                           else reading_examples(next(worlds), rng, distractors))]
        rng.shuffle(pool)
        for prompt, answer in pool:
            if name_filter.find(prompt + answer) is None:
                yield prompt, answer


def tokenizer_texts(args: PretrainArgs, reserved: Sequence[str], per_world: int = 20) -> list[str]:
    """The tokenizer's corpus: a few examples from each of many worlds (so merges are syllables
    shared by many names, not whole names), the relation vocabularies of both KGs, the prompts."""
    from ragrl.toy.tiny_model import with_prompt_text

    rng = random.Random(args.seed + 7919)
    name_filter = NameFilter(reserved)
    worlds = corpus_worlds(args.seed + 7919, args.world_people, reserved)
    texts = []
    for _ in range(args.tokenizer_worlds):
        examples = reading_examples(next(worlds), rng, args.distractors)[:per_world]
        texts += [p + a for p, a in examples if name_filter.find(p + a) is None]
    kg_words = [f'"{r.kg_a}", "{r.kg_b}" {r.key}' for r in RELATIONS]
    return with_prompt_text(texts + kg_words * 50)


# --------------------------------------------------------------------------- batches


class PackedBatches:
    """Batches of `batch_size` rows of `seq_len` tokens, each row as many whole examples as fit.

    Examples are joined by end-of-text; the rest of a row is padding (label -100). An example is
    never split across rows (its answer would be cut off from the passages it is read from);
    one longer than `seq_len` is skipped. Each batch is (ids, labels, weights): labels are -100
    on padding (and outside the answers with `answer_only`), weights are `answer_weight` on
    answer tokens, 1 on other labelled tokens and 0 elsewhere.
    """

    def __init__(self, examples: Iterator[tuple[str, str]], tokenizer, batch_size: int, seq_len: int,
                 answer_only: bool = False, answer_weight: float = 1.0) -> None:
        self.examples, self.tok = examples, tokenizer
        self.batch_size, self.seq_len, self.answer_only = batch_size, seq_len, answer_only
        self.answer_weight = answer_weight
        self.sep = tokenizer.convert_tokens_to_ids(tokenizer.pad_token)
        self._next: tuple[list[int], list[int], list[float]] | None = None
        self.examples_used = 0
        self.skipped = 0

    def _example(self) -> tuple[list[int], list[int], list[float]]:
        for _ in range(1000):
            prompt, answer = next(self.examples)
            p = self.tok.encode(prompt, add_special_tokens=False)
            a = self.tok.encode(answer, add_special_tokens=False) + [self.sep]
            if len(p) + len(a) <= self.seq_len:
                prompt_labels = [-100] * len(p) if self.answer_only else p
                prompt_weights = [0.0 if self.answer_only else 1.0] * len(p)
                return p + a, prompt_labels + a, prompt_weights + [self.answer_weight] * len(a)
            self.skipped += 1
        raise InputError(f"pretrain.seq_len={self.seq_len}: 1000 examples in a row are longer; raise it (512 fits most)")

    def _row(self) -> tuple[list[int], list[int], list[float]]:
        ids: list[int] = []
        labels: list[int] = []
        weights: list[float] = []
        while True:
            if self._next is None:
                self._next = self._example()
            e_ids, e_lab, e_w = self._next
            if ids and len(ids) + len(e_ids) > self.seq_len:
                break
            ids += e_ids
            labels += e_lab
            weights += e_w
            self._next = None
            self.examples_used += 1
        pad = self.seq_len - len(ids)
        return ids + [self.sep] * pad, labels + [-100] * pad, weights + [0.0] * pad

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = [self._row() for _ in range(self.batch_size)]
        return (torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]),
                torch.tensor([r[2] for r in rows]))

    def __iter__(self):
        return self


def weighted_lm_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, each target token weighted (weights aligned with `labels`)."""
    logits, labels, weights = logits[:, :-1], labels[:, 1:], weights[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                           labels.reshape(-1), ignore_index=-100, reduction="none")
    weights = weights.reshape(-1) * (labels.reshape(-1) != -100)
    return (ce * weights).sum() / weights.sum().clamp_min(1e-9)


# --------------------------------------------------------------------------- the reading probe


def probe_rows(world_dir: str | Path, split: str, n: int, distractors: int = 1, seed: int = 0,
               types: Sequence[str] | None = None) -> list[dict]:
    """The first `n` questions (of `types`, default all) of a written world's `split`, each with its
    prompt (supporting passages + `distractors` other passages, shuffled) and gold answers.
    Deterministic for a seed."""
    world_dir = Path(world_dir)
    passages = pq.read_table(world_dir / "passages.parquet").to_pylist()
    by_id = {p["id"]: p for p in passages}
    rows = pq.read_table(world_dir / f"qa/{split}.parquet").to_pylist()
    if types is not None:
        rows = [r for r in rows if json.loads(r["metadata"]).get("type", "") in types]
    rows = rows[:n]
    rng = random.Random(seed)
    out = []
    for row in rows:
        docs = [by_id[i] for i in row["supporting_ids"]] + rng.sample(passages, distractors)
        rng.shuffle(docs)
        meta = json.loads(row["metadata"])
        out.append({"id": row["id"], "prompt": reading_prompt(docs, row["question"]),
                    "answers": list(row["golden_answers"]), "type": meta.get("type", "")})
    return out


@torch.no_grad()
def probe_reading(model, tokenizer, rows: Sequence[dict], batch_size: int = 25, max_new_tokens: int = 16) -> dict:
    """Greedy answers to `rows` (from `probe_rows`): exact match overall and per question type."""
    from ragrl.rewards.qa import exact_match

    was_training = model.training
    model.eval()
    sep = tokenizer.convert_tokens_to_ids(tokenizer.pad_token)
    preds = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        enc = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in chunk]
        width = max(map(len, enc))
        ids = torch.tensor([[sep] * (width - len(e)) + e for e in enc])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=sep, eos_token_id=[sep, tokenizer.eos_token_id])
        for row in out[:, width:].tolist():
            preds.append(tokenizer.decode(row, skip_special_tokens=True).split("\n")[0].strip())
    model.train(was_training)
    em = [exact_match(p, r["answers"]) for p, r in zip(preds, rows)]
    by_type: dict[str, list[float]] = {}
    for r, e in zip(rows, em):
        by_type.setdefault(r["type"], []).append(e)
    return {"em": sum(em) / max(len(em), 1), "n": len(em),
            "em_by_type": {t: sum(v) / len(v) for t, v in sorted(by_type.items())},
            "examples": [{"q": r["prompt"].rsplit("Question: ", 1)[-1], "pred": p, "gold": r["answers"][0]}
                         for r, p in list(zip(rows, preds))[:3]]}


# --------------------------------------------------------------------------- training


def lr_at(step: int, args: PretrainArgs) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
    floor = args.lr * args.min_lr_ratio
    return floor + (args.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# Bump when a change to this module changes what a given spec and settings train into: the key of
# a shipped pretrained model (`cache_key`) includes it, so an old artifact is not reused by mistake.
PRETRAIN_VERSION = 2
# Settings that change logging and probing only, not the weights: left out of the cache key.
_KEY_EXCLUDED = ("threads", "log_every", "eval_every", "eval_questions")
# A cached model counts only when these are there (a partly copied directory is not one).
CACHE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "pretrain_log.jsonl", "pretrain_args.json")


def cache_key(spec, args: PretrainArgs, reserved: Sequence[str]) -> str:
    """What a pretrained model is a function of: the model spec, the settings that shape training,
    the names kept out of its corpus (they change the corpus), this module's version and the world
    generator's (its worlds are the corpus)."""
    import hashlib

    from ragrl.io import canonical_json

    settings = {k: v for k, v in asdict(args).items() if k not in _KEY_EXCLUDED}
    blob = canonical_json({"spec": asdict(spec), "settings": settings, "version": PRETRAIN_VERSION,
                           "world_version": WORLD_VERSION,
                           "reserved": hashlib.sha256("\n".join(sorted(reserved)).encode()).hexdigest()})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def pretrain(world_dir: str | Path, out_dir: str | Path, spec=None, args: PretrainArgs = PretrainArgs(),
             probe_split: str = "dev", cache_dir: str | Path | None = None, write_cache: bool = False) -> Path:
    """Build the tokenizer and the tiny model, pretrain it, write it to `out_dir` (HF format).

    `world_dir`: the evaluation world; its names are kept out of the corpus, and `probe_split`
    of its questions is the reading probe (dev by default: test stays untouched until evaluation).
    `cache_dir`: pretrained models by `cache_key` (the repository ships the default's under
    resources/pretrained/): a model whose key matches is copied instead of retrained, and with
    `write_cache` a newly trained one is added there.
    """
    from ragrl.toy.tiny_model import TinyModelSpec, build_model, save_tiny_model, train_tokenizer

    spec = spec or TinyModelSpec()
    if args.threads:
        torch.set_num_threads(args.threads)
    reserved = world_names(world_dir)
    out_dir = Path(out_dir)
    key = cache_key(spec, args, reserved)
    cached = Path(cache_dir) / key if cache_dir else None
    if cached is not None and all((cached / f).is_file() for f in CACHE_FILES):
        with atomic_dir(out_dir) as tmp:
            shutil.copytree(cached, tmp, dirs_exist_ok=True)
        _log(f"reused the pretrained model {cached} (cache key {key}: same spec, settings, kept-out names and "
             f"pretrain version {PRETRAIN_VERSION}); delete that directory to pretrain again")
        return out_dir
    if cached is not None:
        _log(f"no pretrained model under {cached} (cache key {key}); pretraining")
    t0 = time.monotonic()
    tokenizer = train_tokenizer(tokenizer_texts(args, reserved), spec.vocab_size)
    tokenizer.model_max_length = spec.max_position_embeddings
    model = build_model(tokenizer, spec)
    _log(f"tokenizer ({len(tokenizer)} tokens) and model ({sum(p.numel() for p in model.parameters()):,} "
         f"parameters) built in {time.monotonic() - t0:.1f}s; {len(reserved)} evaluation-world names kept out")
    probe = probe_rows(world_dir, probe_split, args.eval_questions, types=args.reading_types) if args.eval_questions else []
    history = train_loop(model, tokenizer, corpus_examples(args.seed, args.world_people, args.distractors, reserved,
                                                           args.mix_worlds, args), args, probe)
    with atomic_dir(out_dir) as tmp:
        save_tiny_model(tokenizer, model.eval(), spec, tmp)
        (tmp / "pretrain_log.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in history))
        write_json({"args": asdict(args), "probe_split": probe_split, "reserved_names": len(reserved),
                    "cache_key": key, "pretrain_version": PRETRAIN_VERSION, "world_version": WORLD_VERSION}, tmp / "pretrain_args.json")
        write_record(tmp, training_record("pretrain", [segment(0)]))
    if cached is not None and write_cache:
        with atomic_dir(cached) as tmp:
            shutil.copytree(out_dir, tmp, dirs_exist_ok=True)
        _log(f"stored in the cache as {cached}")
    return out_dir


def train_loop(model, tokenizer, examples: Iterator[tuple[str, str]], args: PretrainArgs,
               probe: Sequence[dict] = ()) -> list[dict]:
    """AdamW on packed batches for `args.steps` steps; returns the log records."""
    torch.manual_seed(args.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    batches = PackedBatches(examples, tokenizer, args.batch_size, args.seq_len, args.answer_only_loss,
                            args.answer_weight)
    model.train()
    history: list[dict] = []
    start, window = time.monotonic(), []
    for step in range(args.steps):
        lr = lr_at(step, args)
        for group in opt.param_groups:
            group["lr"] = lr
        ids, labels, weights = next(batches)
        loss = weighted_lm_loss(model(input_ids=ids).logits, labels, weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window.append(loss.item())
        done = step + 1
        last = done == args.steps
        if done % args.log_every == 0 or last:
            rec = {"step": done, "loss": sum(window) / len(window), "lr": lr,
                   "tokens": done * args.batch_size * args.seq_len, "examples": batches.examples_used,
                   "elapsed_s": round(time.monotonic() - start, 1)}
            window = []
            if probe and ((args.eval_every and done % args.eval_every == 0) or last):
                result = probe_reading(model, tokenizer, probe)
                rec["probe_em"] = result["em"]
                rec["probe_em_by_type"] = result["em_by_type"]
                rec["probe_examples"] = result["examples"]
            history.append(rec)
            _log(f"step {done}/{args.steps} loss={rec['loss']:.4f} lr={lr:.3g} examples={rec['examples']} "
                 f"{rec['elapsed_s']}s" + (f" probe_em={rec['probe_em']:.3f} {rec['probe_em_by_type']}"
                                          if "probe_em" in rec else ""))
            if "probe_em" in rec:
                for ex in rec["probe_examples"]:
                    _log(f"  probe: {ex['q']!r} -> {ex['pred']!r} (gold {ex['gold']!r})")
    return history


def _log(msg: str) -> None:
    print(f"[pretrain] {msg}", file=sys.stderr, flush=True)
