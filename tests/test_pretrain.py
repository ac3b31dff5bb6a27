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

ROOT = Path(__file__).resolve().parents[1]


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
    # An example is longer than 100 tokens, so this covers every example the steps consume.
    budget = settings.steps * settings.batch_size * settings.seq_len // 100
    stream = corpus_examples(settings.seed, settings.world_people, settings.distractors, reserved,
                             settings.mix_worlds)
    for _ in range(budget):
        prompt, answer = next(stream)
        check(prompt + answer)


def test_corpus_examples_read_like_retrieval_results():
    prompt, answer = next(corpus_examples(0, 30, 1, reserved=[]))
    assert prompt.startswith("Doc 1(Title: ")
    assert "\nQuestion: " in prompt and prompt.endswith("\nAnswer:")
    assert answer.startswith(" ") and answer.strip()


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

    ids, labels = next(PackedBatches(corpus_examples(0, 30, 1, reserved=[]), _CharTokenizer(), 2, 4000))
    assert ids.shape == (2, 4000)
    for row_ids, row_labels in zip(ids.tolist(), labels.tolist()):
        used = [i for i, lab in zip(row_ids, row_labels) if lab != -100]
        assert used and used[-1] == 0  # the row's last example ends with its separator, then padding
    with pytest.raises(ValueError, match="seq_len=16"):
        next(PackedBatches(corpus_examples(0, 30, 1, reserved=[]), _CharTokenizer(), 1, 16))


def test_probe_rows_show_the_supporting_passages(default_world):
    rows = probe_rows(default_world, "dev", 5)
    assert len(rows) == 5
    for r in rows:
        assert r["prompt"].count("Doc ") >= 2 and r["answers"]
