"""Per-sequence attention over a padding-free row (ragrl.train.packed_attention): on a packed row it
equals SDPA under the block-diagonal causal mask transformers builds, grouped-query heads
included; anything else is SDPA's own call, unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations import sdpa_attention as sdpa_module
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ragrl.train.packed_attention import attends_per_sequence, packed_bounds, packed_sdpa_attention

LENGTHS = [3, 7, 1, 5]


def _qkv(heads=4, kv_heads=2, dim=8, length=sum(LENGTHS), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, length, dim, generator=gen), torch.randn(1, kv_heads, length, dim, generator=gen),
            torch.randn(1, kv_heads, length, dim, generator=gen))


def _cu(lengths=LENGTHS):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _block_causal(lengths=LENGTHS):
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    pos = torch.arange(len(seq))
    return ((seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None]))[None, None]


def test_packed_row_equals_sdpa_under_the_block_mask():
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    q, k, v = _qkv()
    cu = _cu()
    got, _ = packed_sdpa_attention(module, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    want, _ = sdpa_attention_forward(module, q, k, v, _block_causal(), scaling=0.3)
    assert got.shape == want.shape == (1, sum(LENGTHS), 4, 8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # a leak across a join would change the second sequence's first token
    leaky, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.3, is_causal=True)
    assert not torch.allclose(leaky[:, 3], want[:, 3], atol=1e-4)


CASES = ["no bounds", "two rows", "decoding", "q and k differ", "bounds short of the row", "sliding window",
         "soft-capping", "sinks", "bidirectional (argument)", "bidirectional (module)"]


@pytest.mark.parametrize("case", CASES)
def test_anything_else_is_sdpa_as_is(case, monkeypatch):
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    q, k, v = _qkv()
    mask = _block_causal()
    kwargs = {"cu_seq_lens_q": _cu(), "cu_seq_lens_k": _cu()}
    is_causal = None
    if case == "no bounds":
        kwargs = {}
    elif case == "two rows":
        q, k, v, mask = (torch.cat([t, t]) for t in (q, k, v, mask))
    elif case == "decoding":  # one new query against the cached keys
        q, mask = q[:, :, -1:], mask[:, :, -1:]
    elif case == "q and k differ":
        kwargs["cu_seq_lens_k"] = _cu([3, 8, 5])
    elif case == "bounds short of the row":
        kwargs = {"cu_seq_lens_q": _cu([3, 7]), "cu_seq_lens_k": _cu([3, 7])}
    elif case == "sliding window":
        kwargs["sliding_window"] = 4
    elif case == "soft-capping":
        kwargs["softcap"] = 30.0
    elif case == "sinks":
        kwargs["s_aux"] = torch.zeros(4)
    elif case == "bidirectional (argument)":
        is_causal = False
    else:
        module.is_causal = False
    assert packed_bounds(module, q, k, is_causal, kwargs) is None
    calls = []
    monkeypatch.setattr(sdpa_module, "sdpa_attention_forward", lambda *a, **kw: calls.append((a, kw)) or ("sdpa", None))
    assert packed_sdpa_attention(module, q, k, v, mask, is_causal=is_causal, **kwargs) == ("sdpa", None)
    (args, passed), = calls
    assert args[0] is module and args[1] is q and args[4] is mask  # as given, with transformers' mask
    want = {"dropout": 0.0, "scaling": None, "is_causal": is_causal, **kwargs}
    assert passed.keys() == want.keys()
    assert all(passed[key] is want[key] if torch.is_tensor(want[key]) else passed[key] == want[key] for key in want)


@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("case", ["sliding window", "soft-capping", "bidirectional (argument)", "bounds short of the row"])
def test_a_packed_row_without_a_mask_that_cannot_go_per_sequence_is_refused(case, mask):
    # A packed row with no mask, or a mask that ignores the packing (what transformers builds from an
    # all-ones one): SDPA's own path would attend across the joins, so an attention the per-sequence
    # path cannot do is an error, not a silent leak.
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    q, k, v = _qkv()
    kwargs = {"cu_seq_lens_q": _cu(), "cu_seq_lens_k": _cu()}
    is_causal = None
    if case == "sliding window":
        kwargs["sliding_window"] = 4
    elif case == "soft-capping":
        kwargs["softcap"] = 30.0
    elif case == "bidirectional (argument)":
        is_causal = False
    else:
        kwargs = {"cu_seq_lens_q": _cu([3, 7]), "cu_seq_lens_k": _cu([3, 7])}
    causal = torch.ones(16, 16, dtype=torch.bool).tril()[None, None]
    with pytest.raises(RuntimeError, match="sft.padding_free and rl.padding_free to false"):
        packed_sdpa_attention(module, q, k, v, None if mask == "none" else causal, is_causal=is_causal, **kwargs)
    # One sequence alone has no join to leak across: SDPA's causal path is the per-sequence one.
    one = {"cu_seq_lens_q": _cu([16]), "cu_seq_lens_k": _cu([16])}
    got, _ = packed_sdpa_attention(module, q, k, v, None, is_causal=True, sliding_window=None, **one)
    assert got.shape == (1, 16, 4, 8)


def test_a_packed_row_whose_boundaries_leave_the_row_is_refused_not_indexed():
    # Boundaries that are no partition of the row (a join past its end) cannot be checked against
    # any mask: the clear refusal, not an IndexError from inside the check.
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    q, k, v = _qkv()
    bad = torch.tensor([0, 20, 16], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="sft.padding_free and rl.padding_free to false"):
        packed_sdpa_attention(module, q, k, v, _block_causal(), cu_seq_lens_q=bad, cu_seq_lens_k=bad)


@pytest.mark.parametrize("name, settings, plain", [
    ("qwen2", {}, True),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}, False),
    ("llama", {}, True),
    ("mistral", {"sliding_window": 4096}, False),
    ("gemma2", {}, False),
])
def test_only_a_model_whose_every_layer_attends_per_sequence_skips_the_block_mask(name, settings, plain):
    # A sliding-window or soft-capped layer cannot go per sequence; given an all-ones mask it would
    # attend across the joins, so such a model keeps transformers' block mask.
    import transformers

    config = transformers.AutoConfig.for_model(name, num_hidden_layers=2, **settings)
    assert attends_per_sequence(config) is plain
