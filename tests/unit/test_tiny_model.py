from __future__ import annotations

import os

# Before transformers is imported: huggingface_hub reads it once, and nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random
import re
import string
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from ragrl.toy import tiny_model
from ragrl.toy.tiny_model import (
    CHAT_TOKENS,
    PROTOCOL_TAGS,
    TinyModelSpec,
    build_model,
    build_tiny,
    generate_text,
    train_tokenizer,
)

FIXED_INPUT = "abc <think>kq zu</think><search>foo bar</search>\n<answer>x</answer>"


def _corpus(n_sentences: int = 300, seed: int = 0) -> list[str]:
    # Random-letter words: a syllable-based lexicon runs out of BPE merges well before 2000 tokens.
    rng = random.Random(seed)
    lexicon = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(1500)]
    return [" ".join(rng.choice(lexicon) for _ in range(rng.randint(6, 16))) + "." for _ in range(n_sentences)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    corpus = _corpus()
    spec = TinyModelSpec()
    tokenizer = train_tokenizer(corpus, spec.vocab_size)
    model = build_model(tokenizer, spec)
    out_dir = build_tiny(corpus, tmp_path_factory.mktemp("tiny") / "model", spec)
    return SimpleNamespace(corpus=corpus, spec=spec, tokenizer=tokenizer, model=model, dir=out_dir)


def _logits(model, tokenizer, text: str) -> torch.Tensor:
    with torch.no_grad():
        return model(**tokenizer(text, return_tensors="pt")).logits


# --- tokenizer ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tag", PROTOCOL_TAGS)
def test_protocol_tag_is_one_token_alone_and_in_running_text(built, tag):
    tok = built.tokenizer
    tag_id = tok.convert_tokens_to_ids(tag)
    assert tok.encode(tag, add_special_tokens=False) == [tag_id]
    text = f"abc{tag}foo bar{tag}x"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids.count(tag_id) == 2
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_rollout_text_survives_skip_special_tokens(built):
    tok = built.tokenizer
    text = "abc<search>foo bar</search>x"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids)[3] == "<search>"
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text


def test_chat_tokens_are_special_and_tags_are_not(built):
    tok = built.tokenizer
    special = set(tok.all_special_tokens)
    assert set(CHAT_TOKENS) <= special
    assert not set(PROTOCOL_TAGS) & special
    for token in CHAT_TOKENS:
        assert len(tok.encode(token, add_special_tokens=False)) == 1
    assert tok.decode(tok.encode("<|im_start|>a<|im_end|>b<|endoftext|>"), skip_special_tokens=True) == "ab"
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert tok.encode("hello", add_special_tokens=True) == tok.encode("hello", add_special_tokens=False)


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_any_text_round_trips(built, text):
    # Up to Unicode NFC, which Qwen2's normalizer applies (and which the tokenizer must share with
    # Qwen2Tokenizer, see test_reloaded_tokenizer_encodes_exactly_like_the_trained_one).
    tok = built.tokenizer
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == unicodedata.normalize("NFC", text)


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(), tag=st.sampled_from(PROTOCOL_TAGS), suffix=st.text())
def test_tags_stay_single_tokens_in_any_text(built, prefix, tag, suffix):
    tok = built.tokenizer
    text = prefix + tag + suffix
    ids = tok.encode(text, add_special_tokens=False)
    # Tags cannot overlap each other (each has one "<", at its start), so every occurrence must be one id.
    assert ids.count(tok.convert_tokens_to_ids(tag)) == text.count(tag)
    # Tags are matched before normalisation, so NFC applies to the text between them only.
    pieces = re.split("(" + "|".join(map(re.escape, PROTOCOL_TAGS)) + ")", text)
    assert tok.decode(ids) == "".join(p if p in PROTOCOL_TAGS else unicodedata.normalize("NFC", p) for p in pieces)


def test_vocab_size_close_to_requested(built):
    assert 0.95 * built.spec.vocab_size <= len(built.tokenizer) <= built.spec.vocab_size
    vocab = built.model.config.vocab_size
    assert vocab % 64 == 0 and len(built.tokenizer) <= vocab < len(built.tokenizer) + 64


# --- chat template -----------------------------------------------------------------------------


def test_generation_prompt_is_chatml(built):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "who?"}]
    rendered = built.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nwho?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_assistant_mask_covers_exactly_assistant_content(built):
    tok = built.tokenizer
    replies = ["<think>kq zu</think><search>where is it</search>", "<answer>over there</answer>"]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "who?"},
        {"role": "assistant", "content": replies[0]},
        {"role": "user", "content": "<information>doc one</information>"},
        {"role": "assistant", "content": replies[1]},
    ]
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    runs, current = [], []
    for token_id, flag in zip(ids, mask):
        if flag:
            current.append(token_id)
        elif current:
            runs, current = runs + [current], []
    runs += [current] if current else []
    # Decoding each run back to exactly content + <|im_end|> rules out both missing and extra tokens
    # (an extra one would bring in "\n" or a role header).
    assert [tok.decode(run) for run in runs] == [reply + "<|im_end|>" for reply in replies]


# --- model -------------------------------------------------------------------------------------


def test_default_model_shape(built):
    config = built.model.config
    assert config.head_dim == 64 and config.tie_word_embeddings
    assert built.model.lm_head.weight.data_ptr() == built.model.model.embed_tokens.weight.data_ptr()
    assert built.model.dtype == torch.float32
    n_params = sum(p.numel() for p in built.model.parameters())
    assert 3_000_000 <= n_params <= 4_000_000


def test_saved_dir_loads_with_auto_classes_and_matches(built):
    tok = transformers.AutoTokenizer.from_pretrained(built.dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(built.dir).eval()
    assert isinstance(model, transformers.Qwen2ForCausalLM)
    assert model.dtype == torch.float32
    assert tok.encode(FIXED_INPUT) == built.tokenizer.encode(FIXED_INPUT)
    assert tok.decode(tok.encode(FIXED_INPUT), skip_special_tokens=True) == FIXED_INPUT
    assert tok.chat_template == built.tokenizer.chat_template
    assert tok.model_max_length == built.spec.max_position_embeddings
    assert torch.equal(_logits(model, tok, FIXED_INPUT), _logits(built.model, built.tokenizer, FIXED_INPUT))


def test_loaded_model_generates_new_tokens(built):
    tok = transformers.AutoTokenizer.from_pretrained(built.dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(built.dir).eval()
    inputs = tok(FIXED_INPUT, return_tensors="pt")
    n_in = inputs["input_ids"].shape[1]
    out = model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert out.shape[1] == n_in + 6
    # Greedy generate_text (what `ragrl model generate` prints) is the model's own greedy continuation.
    greedy = tok.decode(out[0, n_in : n_in + 4], skip_special_tokens=True)
    assert greedy and generate_text(built.dir, FIXED_INPUT, max_new_tokens=4, seed=None) == greedy
    sampled = [generate_text(built.dir, FIXED_INPUT, 6, seed=s) for s in (3, 3, 4, 5)]
    assert sampled[0] == sampled[1] and all(sampled) and len(set(sampled[1:])) > 1


class _ForceTokenAt:
    """Forces `token_id` at generation step `step`, to see whether generate treats it as a stop token."""

    def __init__(self, n_in: int, step: int, token_id: int):
        self.n_in, self.step, self.token_id = n_in, step, token_id

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] - self.n_in == self.step:
            scores = torch.full_like(scores, -float("inf"))
            scores[:, self.token_id] = 0.0
        return scores


@pytest.mark.parametrize("stop_token", ["<|im_end|>", "<|endoftext|>"])
def test_generate_stops_at_end_of_turn(built, stop_token):
    tok = transformers.AutoTokenizer.from_pretrained(built.dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(built.dir).eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    inputs = tok(prompt, return_tensors="pt")
    n_in = inputs["input_ids"].shape[1]
    force = _ForceTokenAt(n_in, step=2, token_id=tok.convert_tokens_to_ids(stop_token))
    out = model.generate(
        **inputs, max_new_tokens=10, do_sample=False, logits_processor=transformers.LogitsProcessorList([force])
    )
    assert out.shape[1] == n_in + 3


# --- determinism, validation, atomicity --------------------------------------------------------


def test_build_is_deterministic(built, tmp_path):
    again = build_tiny(built.corpus, tmp_path / "again", built.spec)
    assert (again / "tokenizer.json").read_bytes() == (built.dir / "tokenizer.json").read_bytes()
    first, second = load_file(built.dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in built.dir.iterdir())


def test_seed_changes_weights_and_global_rng_is_untouched(built):
    before = torch.get_rng_state()
    same = build_model(built.tokenizer, built.spec)
    other = build_model(built.tokenizer, TinyModelSpec(seed=1))
    assert torch.equal(torch.get_rng_state(), before)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(same.state_dict()[weight], built.model.state_dict()[weight])
    assert not torch.equal(other.state_dict()[weight], built.model.state_dict()[weight])


@pytest.mark.parametrize("kwargs", [{"num_heads": 16}, {"hidden_size": 128}, {"hidden_size": 200, "num_heads": 3}])
def test_head_dim_other_than_64_is_rejected_naming_the_field(kwargs):
    with pytest.raises(ValueError, match="num_heads"):
        TinyModelSpec(**kwargs)


def test_smaller_valid_spec_is_accepted(built):
    # Grouped-query attention with one KV head: the model is built to the spec and runs.
    model = build_model(built.tokenizer, TinyModelSpec(hidden_size=128, num_heads=2, num_kv_heads=1))
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (2, 1)
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (64, 128)  # one head of 64
    ids = built.tokenizer("abc", return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], model.config.vocab_size)


def test_failed_build_leaves_no_output(tmp_path, monkeypatch):
    def save_fails(self, *args, **kwargs):
        raise RuntimeError("disk full")

    # The tokenizer is already written when the model save fails: a partial directory exists midway.
    monkeypatch.setattr(transformers.Qwen2ForCausalLM, "save_pretrained", save_fails)
    spec = TinyModelSpec(vocab_size=400)
    with pytest.raises(RuntimeError, match="disk full"):
        build_tiny(_corpus(50), tmp_path / "model", spec)
    assert list(tmp_path.iterdir()) == []


def test_failed_rebuild_keeps_previous_output(tmp_path, monkeypatch):
    out = tmp_path / "model"
    out.mkdir()
    (out / "marker").write_text("old")
    monkeypatch.setattr(tiny_model, "save_tiny_model", _raise_after_tokenizer)
    with pytest.raises(RuntimeError, match="midway"):
        build_tiny(_corpus(50), out, TinyModelSpec(vocab_size=400))
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in out.iterdir()] == ["marker"]


def _raise_after_tokenizer(tokenizer, model, spec, directory: Path) -> None:
    tokenizer.save_pretrained(directory)
    raise RuntimeError("midway")


def test_reloaded_tokenizer_encodes_exactly_like_the_trained_one(built):
    """AutoTokenizer reloads the saved tokenizer as Qwen2Tokenizer (config.json says qwen2), which
    installs Qwen2's own normalizer and split rule; the trained merges must hold under them, or
    every stage that loads the policy from disk would tokenize differently from the builder."""
    reloaded = transformers.AutoTokenizer.from_pretrained(built.dir)
    texts = built.corpus[:200] + [
        "Born in 1987, she earned 1,309,840 votes; it's 3.5km away!\n\nNew line  two  spaces\tTab.",
        "<think>x</think>\n<search>who is 42?</search>",
        "Ünïcödé naïve café — “quotes” and ½ fractions",
    ]
    for text in texts:
        assert reloaded.encode(text, add_special_tokens=False) == built.tokenizer.encode(text, add_special_tokens=False), text
