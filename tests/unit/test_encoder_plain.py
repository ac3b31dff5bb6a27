"""The plain-transformers encoder path reproduces SentenceTransformer.encode bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ragrl.models import resolve_model_path
from ragrl.retrieval.encoder import DEFAULT_MODEL, Encoder
from ragrl.retrieval.st_stack import PlainStack, plain_stack_plan

MINILM = resolve_model_path(DEFAULT_MODEL)
TEXTS = [
    "",
    "x",
    "who is the mother of Ann Smith?",
    "Ann Smith\nAnn Smith is a painter born in Lyon.",
    " ".join(f"token{i} word" for i in range(400)),  # far beyond 256 word pieces: truncated
    "short",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Émile Zola écrivait des romans.",
    "a b",
]


@pytest.fixture(scope="module")
def st_minilm():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(MINILM, device="cpu")


@pytest.fixture(scope="module")
def minilm() -> Encoder:
    return Encoder(DEFAULT_MODEL, device="cpu", query_prefix="query: ")


def _st_encode(st, texts: list[str], batch_size: int, normalize: bool):
    return st.encode(texts, batch_size=batch_size, normalize_embeddings=normalize, convert_to_numpy=True)


def test_minilm_plain_path_matches_sentence_transformers(minilm: Encoder, st_minilm) -> None:
    assert isinstance(minilm._model, PlainStack)
    assert (minilm.max_length, minilm.dim) == (256, 384)
    for batch_size in (3, 4):  # 3 divides len(TEXTS), 4 does not
        minilm.batch_size = batch_size
        got = minilm.encode_passages(TEXTS, show_progress=False)
        assert np.array_equal(got, _st_encode(st_minilm, TEXTS, batch_size, True))
    queries = TEXTS[:4]
    got = minilm.encode_queries(queries)
    assert np.array_equal(got, _st_encode(st_minilm, ["query: " + q for q in queries], 4, True))


def test_minilm_max_length_override(st_minilm) -> None:
    enc = Encoder(DEFAULT_MODEL, batch_size=4, max_length=32, device="cpu")
    assert isinstance(enc._model, PlainStack)
    assert enc.info()["max_length"] == 32
    got = enc.encode_passages(TEXTS, show_progress=False)
    st_minilm.max_seq_length = 32
    try:
        want = _st_encode(st_minilm, TEXTS, 4, True)
    finally:
        st_minilm.max_seq_length = 256
    assert np.array_equal(got, want)


def _tiny_stack(tmp_path, pooling: str, extra=()) -> str:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(MINILM)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    hf = tmp_path / "hf"
    BertModel(cfg).save_pretrained(hf)
    tok.save_pretrained(hf)
    transformer = modules.Transformer(str(hf), max_seq_length=16)
    stack = [transformer, modules.Pooling(32, pooling), *extra]
    out = tmp_path / "st"
    SentenceTransformer(modules=stack).save(str(out))
    return str(out)


def test_cls_pooling_without_normalize_module(tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    path = _tiny_stack(tmp_path, "cls")
    assert plain_stack_plan(path) == {"max_seq_length": None, "pooling": "cls", "normalize": False}
    st = SentenceTransformer(path, device="cpu")
    for normalize in (False, True):
        enc = Encoder(path, batch_size=4, normalize=normalize, device="cpu")
        assert isinstance(enc._model, PlainStack)
        assert (enc.max_length, enc.dim) == (16, 32)  # ST 6 keeps max_seq_length in the tokenizer config
        got = enc.encode_passages(TEXTS, show_progress=False)
        assert np.array_equal(got, _st_encode(st, TEXTS, 4, normalize))


def test_dense_stack_falls_back_to_sentence_transformers(tmp_path) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense

    path = _tiny_stack(tmp_path, "mean", extra=[Dense(32, 8)])
    assert plain_stack_plan(path) is None
    enc = Encoder(path, batch_size=4, device="cpu")
    assert not isinstance(enc._model, PlainStack)
    assert enc.dim == 8
    got = enc.encode_passages(TEXTS, show_progress=False)
    assert got.shape == (len(TEXTS), 8)
    assert np.array_equal(got, _st_encode(SentenceTransformer(path, device="cpu"), TEXTS, 4, True))


def test_default_prompt_falls_back(tmp_path) -> None:
    path = _tiny_stack(tmp_path, "mean")
    assert plain_stack_plan(path) is not None
    cfg_path = tmp_path / "st" / "config_sentence_transformers.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(prompts={"query": "query: ", "document": ""}, default_prompt_name="query")
    cfg_path.write_text(json.dumps(cfg))
    assert plain_stack_plan(path) is None


def test_legacy_pooling_flags() -> None:
    plan = plain_stack_plan(MINILM)
    assert plan == {"max_seq_length": 256, "pooling": "mean", "normalize": True}


@pytest.mark.slow  # a fresh interpreter importing torch + transformers: ~11 s of CPU on 2 cores
def test_plain_path_does_not_import_sentence_transformers() -> None:
    code = (
        "import sys\n"
        "from ragrl.retrieval.encoder import Encoder\n"
        "e = Encoder(device='cpu')\n"
        "assert e.encode_queries(['who is Ann?']).shape == (1, 384)\n"
        "assert 'sentence_transformers' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
