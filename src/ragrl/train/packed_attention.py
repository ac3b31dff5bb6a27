"""Attention over a padding-free row one sequence at a time (`sft.padding_free`, `rl.padding_free`).

TRL's padding-free collator joins a batch's sequences into one row and passes their boundaries
(`cu_seq_lens_q` / `cu_seq_lens_k`, the varlen kernels' arguments) along with position ids that
restart at each sequence. Without flash-attention, transformers' SDPA path (its default) turns
those position ids into a block-diagonal mask over the whole row and attends over all L x L
pairs, so a row of 16 sequences costs 16x the attention of the sequences alone, plus the masked
kernel's slower path. The function registered here runs SDPA once per sequence with `is_causal`,
which is what the varlen kernels do: Σ len² instead of L² work, and the causal kernel.

Anything that is not a plain causal packed row goes to transformers' own SDPA function with the
mask transformers built for it (the mask interface is SDPA's, so that mask is the one `sdpa`
would get): padding, decoding against a cache (queries shorter than keys), several rows, query
and key boundaries that differ, and attention this function does not reproduce (a sliding
window, soft-capping, attention sinks, a position bias, bidirectional attention).
"""

from __future__ import annotations

import torch

NAME = "ragrl_packed_sdpa"
# Keyword arguments that change what attention computes; with any of them set, SDPA's own path runs.
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "position_bias")


def packed_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          is_causal=None, **kwargs):
    """transformers' attention-function signature: query [B, H, L, D], key/value [B, KV, L, D];
    returns ([B, L, H, D], None)."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    bounds = packed_bounds(module, query, key, is_causal, kwargs)
    if bounds is None and attention_mask is None and _several_sequences(query, key, kwargs):
        # A packed row that came with no mask (padding-free SFT and RL skip transformers' L x L mask, which
        # only this function's per-sequence path can do without): SDPA's causal path would attend
        # across the joins.
        raise RuntimeError("a packed row of several sequences reached attention without a mask, and this attention "
                           "(a sliding window, soft-capping, sinks, a position bias or bidirectional) cannot be split "
                           "per sequence: set sft.padding_free and rl.padding_free to false")
    if bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = torch.cat([
        torch.nn.functional.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=dropout, scale=scaling, is_causal=True)
        for s, e in zip(bounds[:-1], bounds[1:])
    ], dim=2)
    return out.transpose(1, 2).contiguous(), None


def _several_sequences(query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> bool:
    cu = kwargs.get("cu_seq_lens_q")
    return cu is not None and cu.numel() > 2 and query.shape[0] == 1 and query.shape[2] == key.shape[2]


def packed_bounds(module, query: torch.Tensor, key: torch.Tensor, is_causal, kwargs: dict) -> list[int] | None:
    """The sequence boundaries [0, ..., L] of a plain causal packed row, or None for anything else."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None or cu_k is None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if not causal or any(kwargs.get(k) is not None for k in _UNSUPPORTED) or not torch.equal(cu_q, cu_k):
        return None
    bounds = [int(b) for b in cu_q.tolist()]
    rising = all(a < b for a, b in zip(bounds, bounds[1:]))
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != query.shape[2] or not rising:
        return None
    return bounds


def register() -> str:
    """Make NAME a valid `attn_implementation` (idempotent); returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, packed_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
