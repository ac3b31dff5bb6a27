from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import re
from pathlib import Path

import pytest
import yaml

from ragrl.toy.world import generate_world, write_world
from ragrl.train.pretrain import (
    NameFilter,
    PretrainArgs,
    corpus_examples,
    pretrain,
    probe_rows,
    tokenizer_texts,
    world_names,
)

ROOT = Path(__file__).resolve().parents[2]


def _default_config() -> dict:
    return yaml.safe_load((ROOT / "config/config.yaml").read_text())


@pytest.fixture(scope="module")
def default_world(tmp_path_factory):
    cfg = _default_config()["world"]
    out = tmp_path_factory.mktemp("world")
    write_world(generate_world(cfg["seed"], cfg["size"]), out)
    return out


def test_name_filter_matches_whole_words_only():
    f = NameFilter(["Velmar", "Gysta D. Brouwam", "Port Aldine"])
    assert f.find("He lives in Port Velmar now.") == "Velmar"
    assert f.find("Velmarholm is far.") is None
    assert f.find("Gysta D. Brouwam's book") == "Gysta D . Brouwam"
    assert f.find("Gysta D. Brouwamson") is None
    assert f.find("Port Aldine.") == "Port Aldine"
    assert f.find("Port Aldineford") is None


@pytest.mark.slow
def test_default_pretraining_text_has_no_name_of_the_world(default_world):
    """Everything the default pretraining reads (tokenizer corpus and the training examples its
    steps consume) is free of the evaluation world's entity names and aliases, dev/test included."""
    settings = PretrainArgs(**_default_config()["pretrain"]["settings"])
    reserved = world_names(default_world)
    split_of = {}
    import pyarrow.parquet as pq

    for e in pq.read_table(default_world / "entities.parquet").to_pylist():
        for n in [e["name"], *e["aliases"]]:
            split_of[n] = e["split"]
    assert {"dev", "test"} <= set(split_of.values())
    assert set(split_of) <= set(reserved)
    # Checked with a plain regex (whole words), independently of the NameFilter the corpus uses.
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, sorted(reserved, key=len, reverse=True)))
                         + r")(?!\w)")

    def check(text: str) -> None:
        found = pattern.search(text)
        assert found is None, f"{split_of.get(found.group())} name {found.group()!r} in the pretraining text"

    for text in tokenizer_texts(settings, reserved):
        check(text)
    # Every example the default's steps consume: as many as the shipped model's log says it used
    # (its last record), else a bound (an example is at least 8 tokens).
    shipped = _shipped_model_dir(default_world)
    if shipped is not None:
        budget = json.loads((shipped / "pretrain_log.jsonl").read_text().splitlines()[-1])["examples"]
    else:
        budget = settings.steps * settings.batch_size * settings.seq_len // 8
    first_words = {re.findall(r"\w+", n)[0] for n in reserved}
    stream = corpus_examples(settings.seed, settings.world_people, settings.distractors, reserved,
                             settings.mix_worlds, settings)
    for _ in range(budget):
        prompt, answer = next(stream)
        # the full regex only where a reserved name's first word occurs (it is slow on 10^5 texts)
        if first_words.intersection(re.findall(r"\w+", prompt + answer)):
            check(prompt + answer)


def test_the_default_config_finds_its_shipped_pretrained_model(default_world):
    # Without it `make run` pretrains for ~45 minutes: a version bump (PRETRAIN_VERSION,
    # WORLD_VERSION) or a settings change must ship a model trained under it, named by its key.
    from ragrl.train.pretrain import CACHE_FILES, PRETRAIN_VERSION, WORLD_VERSION

    shipped = _shipped_model_dir(default_world)
    assert shipped is not None, "no directory of resources/pretrained/ has the default config's cache key"
    assert all((shipped / f).is_file() for f in CACHE_FILES)
    recorded = json.loads((shipped / "pretrain_args.json").read_text())
    assert (recorded["cache_key"], recorded["pretrain_version"], recorded["world_version"]) == (
        shipped.name, PRETRAIN_VERSION, WORLD_VERSION)


def _shipped_model_dir(world_dir: Path) -> Path | None:
    """The pretrained model the repository ships for the default config, if any."""
    from ragrl.toy.tiny_model import TinyModelSpec
    from ragrl.train.pretrain import cache_key

    cfg = _default_config()
    spec = TinyModelSpec(**cfg["models"]["tiny"])
    key = cache_key(spec, PretrainArgs(**cfg["pretrain"]["settings"]), world_names(world_dir))
    path = ROOT / cfg["pretrain"]["cache"] / key
    return path if (path / "model.safetensors").is_file() else None


def test_corpus_examples_read_like_retrieval_results():
    prompt, answer = next(corpus_examples(0, 30, 1, reserved=[]))
    assert prompt.startswith("Doc 1(Title: ")
    assert "\nQuestion: " in prompt and prompt.endswith("\nAnswer:")
    assert answer.startswith(" ") and answer.strip()


@pytest.mark.slow
def test_pretrain_writes_a_loadable_model_and_its_log(default_world, tmp_path):
    import transformers

    from ragrl.results.plots import plot_pretraining
    from ragrl.toy.tiny_model import TinyModelSpec

    spec = TinyModelSpec(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=128, num_layers=1)
    args = PretrainArgs(steps=4, batch_size=2, seq_len=512, log_every=2, eval_every=4, eval_questions=3,
                        tokenizer_worlds=5, warmup_steps=1)
    out = pretrain(default_world, tmp_path / "base", spec, args)
    log = [json.loads(x) for x in (out / "pretrain_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 4]
    assert "probe_em" in log[-1] and 0 <= log[-1]["probe_em"] <= 1
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert model.config.hidden_size == 128 and tok.eos_token == "<|im_end|>"
    png = plot_pretraining(out / "pretrain_log.jsonl", tmp_path / "plots" / "pretrain_loss.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


class _CharTokenizer:
    """One id per character: enough for PackedBatches."""

    pad_token = "<pad>"

    def convert_tokens_to_ids(self, token):
        return 0

    def encode(self, text, add_special_tokens=False):
        return [1 + ord(c) % 100 for c in text]


def test_rows_hold_whole_examples_and_too_short_rows_fail_loudly():
    from ragrl.train.pretrain import PackedBatches

    ids, labels, weights = next(PackedBatches(corpus_examples(0, 30, 1, reserved=[]), _CharTokenizer(), 2, 4000,
                                              answer_weight=3.0))
    assert ids.shape == (2, 4000) == weights.shape
    for row_ids, row_labels, row_w in zip(ids.tolist(), labels.tolist(), weights.tolist()):
        used = [i for i, lab in zip(row_ids, row_labels) if lab != -100]
        assert used and used[-1] == 0  # the row's last example ends with its separator, then padding
        # answers (and their separator) weigh 3, the passages 1, padding 0
        assert set(row_w) == {0.0, 1.0, 3.0}
        assert all((w == 0.0) == (lab == -100) for w, lab in zip(row_w, row_labels))
    with pytest.raises(ValueError, match="seq_len=16"):
        next(PackedBatches(corpus_examples(0, 30, 1, reserved=[]), _CharTokenizer(), 1, 16))


def test_probe_rows_show_the_supporting_passages(default_world):
    rows = probe_rows(default_world, "dev", 5)
    assert len(rows) == 5
    for r in rows:
        assert r["prompt"].count("Doc ") >= 2 and r["answers"]


def test_weighted_lm_loss_is_the_weighted_mean_of_next_token_losses():
    import math

    import torch

    from ragrl.train.pretrain import weighted_lm_loss

    # vocab 2; position t predicts labels[t+1]. Uniform logits give log 2 per token; a confident
    # right logit (+10 vs 0) gives log(1 + e^-10).
    logits = torch.tensor([[[0.0, 0.0], [10.0, 0.0], [0.0, 0.0]]])
    labels = torch.tensor([[-100, 1, 0]])
    weights = torch.tensor([[0.0, 1.0, 4.0]])
    want = (1 * math.log(2) + 4 * math.log(1 + math.exp(-10))) / 5
    assert weighted_lm_loss(logits, labels, weights).item() == pytest.approx(want, rel=1e-5)
    # padding (-100) counts for nothing even with a weight
    labels = torch.tensor([[-100, 1, -100]])
    assert weighted_lm_loss(logits, labels, weights).item() == pytest.approx(math.log(2), rel=1e-5)


def test_fact_lists_ask_about_a_fact_they_state():
    import random

    from ragrl.train.pretrain import fact_examples

    world = generate_world(5, 30)
    examples = fact_examples(world, random.Random(0), max_facts=4)
    assert len(examples) > 100
    lengths = set()
    for prompt, answer in examples:
        facts_text, question = prompt.rsplit("\nQuestion: ", 1)
        assert question.endswith("\nAnswer:") and answer.startswith(" ")
        assert answer.strip() in facts_text  # the answer is read, not known
        lengths.add(facts_text.count(". ") + 1)
    assert min(lengths) == 1 and max(lengths) >= 3


@pytest.mark.slow
def test_a_pretrained_model_is_reused_by_its_cache_key(default_world, tmp_path, monkeypatch):
    from ragrl.toy.tiny_model import TinyModelSpec
    from ragrl.train.pretrain import cache_key

    spec = TinyModelSpec(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=128, num_layers=1)
    args = PretrainArgs(steps=2, batch_size=2, seq_len=512, log_every=1, eval_every=0, eval_questions=0,
                        tokenizer_worlds=5, warmup_steps=1)
    cache = tmp_path / "cache"
    first = pretrain(default_world, tmp_path / "a", spec, args, cache_dir=cache, write_cache=True)
    key = cache_key(spec, args, world_names(default_world))
    assert (cache / key / "model.safetensors").read_bytes() == (first / "model.safetensors").read_bytes()
    # Mark the cached copy: a reuse copies it, a retrain would not have the mark.
    (cache / key / "pretrain_log.jsonl").write_text('{"step": 0, "reused": true}\n')
    again = pretrain(default_world, tmp_path / "b", spec, args, cache_dir=cache)
    assert "reused" in (again / "pretrain_log.jsonl").read_text()
    # logging settings do not change the key; training settings and kept-out names do
    assert cache_key(spec, PretrainArgs(**{**args.__dict__, "log_every": 7}), world_names(default_world)) == key
    assert cache_key(spec, PretrainArgs(**{**args.__dict__, "lr": 0.01}), world_names(default_world)) != key
    assert cache_key(spec, args, world_names(default_world)[1:]) != key
    # the corpus is the world generator's worlds: a new generator is a new corpus
    import ragrl.train.pretrain as pretrain_module
    monkeypatch.setattr(pretrain_module, "WORLD_VERSION", pretrain_module.WORLD_VERSION + 1)
    assert cache_key(spec, args, world_names(default_world)) != key
    monkeypatch.undo()
    other = pretrain(default_world, tmp_path / "c", spec, PretrainArgs(**{**args.__dict__, "seed": 1}), cache_dir=cache)
    assert "reused" not in (other / "pretrain_log.jsonl").read_text()


@pytest.mark.slow
def test_two_pretrainings_give_identical_weights(default_world, tmp_path):
    """Issue #34 F3's audit: the tokenizer, the initial weights and the corpus come from the settings'
    seeds, not from the caller's global RNG (left in a different state before each run)."""
    import torch

    from ragrl.toy.tiny_model import TinyModelSpec

    spec = TinyModelSpec(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=128, num_layers=1)
    args = PretrainArgs(steps=2, batch_size=2, seq_len=512, log_every=1, eval_every=0, eval_questions=0,
                        tokenizer_worlds=5, warmup_steps=1)
    runs = []
    for k in range(2):
        torch.manual_seed(100 + k)
        runs.append(pretrain(default_world, tmp_path / f"run{k}", spec, args))
    for name in ("model.safetensors", "tokenizer.json"):
        assert (runs[0] / name).read_bytes() == (runs[1] / name).read_bytes(), name
