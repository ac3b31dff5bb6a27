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

The block mask is the expensive part the per-sequence path never reads (0.78 s of a 1.5 s forward
at 14k tokens), so padding-free SFT and RL hand a packed row over with an all-ones mask, which
makes transformers build none, when `attends_per_sequence(config)`: every layer takes the
per-sequence path. A model with other layers keeps transformers' block mask, since an all-ones
mask there would let its sliding-window layers attend across the joins; a packed row whose mask
does not separate the sequences is refused rather than attended.
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
    if bounds is None and _several_sequences(query, key, kwargs) and not _separates(attention_mask, kwargs):
        # SDPA's own path with this mask (none, or one that ignores the packing) would attend across
        # the joins: a silent leak between training examples.
        raise RuntimeError("a packed row of several sequences reached attention with a mask that does not keep them "
                           "apart, and this attention (a sliding window, soft-capping, sinks, a position bias or "
                           "bidirectional) or these boundaries (cu_seq_lens not rising from 0 to the row's length) "
                           "cannot be split per sequence: set sft.padding_free and rl.padding_free to false")
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


def _separates(mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether `mask` keeps the first token of each packed sequence from attending to the last token
    of the one before (a block mask does; none, or a causal or sliding one, does not)."""
    if mask is None:
        return False
    joins = kwargs["cu_seq_lens_q"][1:-1].long().to(mask.device)
    rows = mask.reshape(-1, *mask.shape[-2:])[0]
    if not bool(((joins >= 1) & (joins < rows.shape[0])).all()):
        return False  # boundaries outside the row: nothing to check them against, so no leak-free proof
    seen = rows[joins, joins - 1]
    blocked = ~seen if seen.dtype == torch.bool else seen <= torch.finfo(seen.dtype).min / 2
    return bool(blocked.all())


def attends_per_sequence(config) -> bool:
    """Whether every layer of a model with `config` takes the per-sequence path on a packed row:
    causal attention over all earlier positions, with no sliding window, soft-capping or chunked
    attention. Only then may a packed row go in with an all-ones mask (see the module docstring)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types is not None:
        if any(t != "full_attention" for t in types):
            return False
    elif getattr(text, "sliding_window", None) is not None:
        return False
    return not any(getattr(text, k, None) for k in ("attn_logit_softcapping", "attention_chunk_size"))


def packed_row_mask(input_ids: torch.Tensor, config) -> torch.Tensor | None:
    """The attention mask a packed row goes in with: all ones where every layer attends per
    sequence (transformers then builds no block mask), else none, so that transformers builds the
    block mask from the position ids for the layers that need it."""
    return torch.ones_like(input_ids) if attends_per_sequence(config) else None


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
