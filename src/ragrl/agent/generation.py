"""Generation backends for the rollout engine: Hugging Face transformers, and an OpenAI-compatible
completions server (vLLM).

The interface is token ids in, token ids out:

    generate(batch_token_ids, max_new_tokens, temperature, top_p, seed,
             stop_token_ids=(), stop_strings=()) -> list[list[int]]

It returns only the new tokens of each row, cut right after the first stop token (inclusive, so
the closing action tag or eos stays in the response and the policy learns to emit it), never
longer than that row's budget, and without padding. `max_new_tokens` is one int or one per row.
Token ids rather than text keep the training tokens exactly the sampled tokens: re-encoding
decoded text can merge differently and then the log-probabilities a trainer computes are for a
sequence the policy never produced.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import torch
import transformers


class Generator(Protocol):
    def generate(
        self,
        batch_token_ids: list[list[int]],
        max_new_tokens: int | Sequence[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        *,
        stop_token_ids: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
    ) -> list[list[int]]: ...


class GenerationBackendError(RuntimeError):
    """The generation server failed or answered something unusable."""


def row_limits(max_new_tokens: int | Sequence[int], n: int) -> list[int]:
    limits = [int(max_new_tokens)] * n if isinstance(max_new_tokens, int) else [int(x) for x in max_new_tokens]
    if len(limits) != n:
        raise ValueError(f"{len(limits)} max_new_tokens for {n} rows")
    if any(x < 0 for x in limits):
        raise ValueError(f"negative max_new_tokens in {limits}")
    return limits


def cut_at_stop(ids: Sequence[int], stop_ids: Sequence[int] | set[int], limit: int | None = None) -> list[int]:
    """`ids` up to and including the first stop id, and at most `limit` tokens."""
    out = list(ids if limit is None else ids[:limit])
    stops = set(stop_ids)
    for i, token in enumerate(out):
        if token in stops:
            return out[: i + 1]
    return out


# --------------------------------------------------------------------------- Hugging Face


class _RowBudget(transformers.StoppingCriteria):
    """Per-row max_new_tokens: a finished row is padded by `generate` and its pads are cut later."""

    def __init__(self, start: int, limits: list[int]) -> None:
        self.start = start
        self.limits = torch.tensor(limits)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        return (input_ids.shape[1] - self.start) >= self.limits.to(input_ids.device)


class _GrowingKVLayer(transformers.cache_utils.DynamicLayer):
    """A DynamicLayer that appends into a buffer grown geometrically.

    transformers' DynamicLayer concatenates the whole key/value cache with each new token, so one
    decoding step copies every cached position: on CPU that copying was a quarter of an
    AutoGraph-R1 evaluation (256-token turns over 1-2k-token contexts; docs/BENCHMARKS.md). Here
    the keys and values are views of a buffer that doubles when full, so a step writes one
    position. Anything that replaces the views (crop, batch selection) is noticed by the data
    pointer and re-buffered on the next update.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.get_seq_length()
        end = n + key_states.shape[-2]
        buf = self._key_buf
        if (buf is None or buf.shape[-2] < end or buf.shape[:2] != key_states.shape[:2]
                or (n and self.keys.data_ptr() != buf.data_ptr())):
            shape = (*key_states.shape[:-2], max(2 * end, 64), key_states.shape[-1])
            self._key_buf, self._value_buf = key_states.new_empty(shape), value_states.new_empty(shape)
            if n:
                self._key_buf[..., :n, :] = self.keys
                self._value_buf[..., :n, :] = self.values
        self._key_buf[..., n:end, :] = key_states
        self._value_buf[..., n:end, :] = value_states
        self.keys, self.values = self._key_buf[..., :end, :], self._value_buf[..., :end, :]
        return self.keys, self.values

    def keep(self, rows: torch.Tensor, start: int, room: int) -> None:
        """Keep only batch `rows` and the positions from `start` on, with `room` free positions after."""
        n = self.get_seq_length() - start
        for name in ("key", "value"):
            old = getattr(self, f"{name}s")
            buf = old.new_empty((len(rows), old.shape[1], n + room, old.shape[-1]))
            buf[..., :n, :] = old[rows, :, start:, :]
            setattr(self, f"_{name}_buf", buf)
            setattr(self, f"{name}s", buf[..., :n, :])


def growing_cache(config) -> transformers.DynamicCache:
    """The DynamicCache `generate` would build for `config`, its plain full-attention layers growing
    in place (_GrowingKVLayer); sliding-window and other special layers are kept as they are."""
    cache = transformers.DynamicCache(config=config)
    plain = transformers.cache_utils.DynamicLayer
    cache.layers = [_GrowingKVLayer() if type(layer) is plain else layer for layer in cache.layers]
    return cache


def sample_tokens(logits: torch.Tensor, noise: torch.Tensor | None, temperature: float, top_p: float) -> torch.Tensor:
    """One token per row of `logits`: argmax when `temperature` <= 0; else a draw from the
    temperature / top-p softmax, made as `torch.multinomial(probs, 1)` makes it inside transformers'
    `generate`: argmax(probs / noise), `noise` one row of Exp(1) draws per row. With the noise drawn
    for every row of the call at every step, as `generate` draws it, a seeded call samples the
    tokens `generate` samples, and a row's token depends on its own logits and noise only."""
    if temperature <= 0 or noise is None:
        return logits.argmax(-1)
    scores = logits.float() / temperature
    if top_p < 1.0:  # transformers' TopPLogitsWarper: drop the least likely tokens whose mass is <= 1 - top_p
        ascending, order = scores.sort(dim=-1)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return (scores.softmax(dim=-1) / noise).argmax(-1)


class _KeptPrefixes:
    """The KV of the sequences one generate call ended with, for the next call to start from.

    A multi-turn rollout calls `generate` once per turn with each trajectory's whole context, which
    is the previous call's sequence plus the observation: the shared prefix need not be run again
    (transformers' `generate` prefills it every turn, about half of a rollout's time on CPU). Only
    the previous call's sequences are kept, and only inside `HFGenerator.keep_prefixes()`, the
    span of one rollout, so a weight update between rollouts can never meet a stale cache.
    """

    def __init__(self) -> None:
        self.previous: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self.current: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self._tokens: torch.Tensor | None = None

    @contextlib.contextmanager
    def call(self):
        """One generate call: it matches against the previous call's sequences and collects its
        own; the previous ones are freed when it ends, before the environment's turn (retrieval may
        share the device)."""
        self.previous, self.current, self._tokens = self.current, [], None
        try:
            yield self
        finally:
            self.previous, self._tokens = [], None

    def match(self, prompt: Sequence[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(length, per-layer (K, V)) of the longest kept prefix of `prompt`, leaving at least one
        token to run (the next token's logits come from it); (0, None) if none."""
        if not self.previous or len(prompt) < 2:
            return 0, None
        if self._tokens is None:
            width = max(len(t) for t, _ in self.previous)
            self._tokens = torch.full((len(self.previous), width + 1), -1, dtype=torch.long)
            for i, (t, _) in enumerate(self.previous):
                self._tokens[i, : len(t)] = torch.tensor(t, dtype=torch.long)
        m = min(len(prompt) - 1, self._tokens.shape[1] - 1)
        same = self._tokens[:, :m] == torch.tensor(prompt[:m], dtype=torch.long)
        # common prefix length per kept sequence: the first mismatch (or m)
        lengths = torch.cat([same, torch.zeros(len(same), 1, dtype=torch.bool)], 1).long().argmin(1)
        best = int(lengths.argmax())
        k = int(lengths[best])
        return (k, self.previous[best][1]) if k > 0 else (0, None)


class HFGenerator:
    """Batched generation with a Hugging Face causal LM; sampling when temperature > 0, greedy otherwise.

    The decoding loop is ragrl's own (`_decode`): rows that have stopped leave the batch as it goes
    (transformers' `generate` keeps computing them until the last row stops), the left padding no
    remaining row needs is dropped, and inside `keep_prefixes()` a call starts from the KV the
    previous call left. Its greedy tokens are `generate`'s (tests/unit/test_rollout.py), up to float
    rounding between batch shapes. It applies temperature and top-p only: a checkpoint's
    generation_config processors (suppress_tokens, min_new_tokens, ...) are not applied, which is
    the plain policy an RL trainer scores. `stop_strings` (multi-token tags of a real tokenizer), a
    model the loop cannot drive (`_own_loop_fits`), or `own_loop = False` (the environment's
    RAGRL_HF_DECODE=transformers, for benchmarks or a model the loop does not suit) take
    `model.generate` instead. The model's own eos ids (generation_config) always stop too. Seeded
    runs are reproducible: the RNG is seeded inside a forked RNG state, so callers' random streams
    are untouched; an unseeded call draws from torch's global stream and advances it, as sampling
    with torch does (reproducible from `torch.manual_seed`).
    """

    def __init__(self, model, pad_token_id: int, tokenizer=None, max_batch_size: int | None = None) -> None:
        self.model = model.eval()
        self.pad_token_id = int(pad_token_id)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        eos = getattr(model.generation_config, "eos_token_id", None)
        self.eos_ids: tuple[int, ...] = tuple(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))
        self._kept: _KeptPrefixes | None = None
        decode = os.environ.get("RAGRL_HF_DECODE", "ragrl")
        if decode not in ("ragrl", "transformers"):
            raise ValueError(f"RAGRL_HF_DECODE={decode!r}: expected 'ragrl' or 'transformers'")
        self.own_loop = decode == "ragrl"
        self._fits: bool | None = None  # _own_loop_fits(model), asked once

    @contextlib.contextmanager
    def keep_prefixes(self):
        """Within the block, each call reuses the KV of the previous call's sequences that its
        prompts extend (one multi-turn rollout; see _KeptPrefixes)."""
        outer, self._kept = self._kept, _KeptPrefixes()
        try:
            yield self
        finally:
            self._kept = outer

    @classmethod
    def from_pretrained(cls, path, device: str | torch.device = "cpu", dtype: torch.dtype | str = "auto",
                        max_batch_size: int | None = None) -> HFGenerator:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(model, pad, tokenizer=tokenizer, max_batch_size=max_batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, batch_token_ids, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, *,
                 stop_token_ids=(), stop_strings=()) -> list[list[int]]:
        limits = row_limits(max_new_tokens, len(batch_token_ids))
        if temperature <= 0:
            # Greedy rows with the same prompt and budget decode to the same tokens: decode each once
            # (HARR's G rollouts of a question share their first turn).
            keys = [(tuple(p), lim) for p, lim in zip(batch_token_ids, limits)]
            distinct = list(dict.fromkeys(keys))
            if len(distinct) < len(keys):
                new = self.generate([list(p) for p, _ in distinct], [lim for _, lim in distinct], temperature,
                                    top_p, seed, stop_token_ids=stop_token_ids, stop_strings=stop_strings)
                at = dict(zip(distinct, new))
                return [list(at[k]) for k in keys]
        stops = tuple(dict.fromkeys([*stop_token_ids, *self.eos_ids]))
        out: list[list[int]] = [[] for _ in batch_token_ids]
        rows = [i for i, lim in enumerate(limits) if lim > 0]
        size = self.max_batch_size or max(len(rows), 1)
        if self._fits is None:
            self._fits = _own_loop_fits(self.model)
        own = self.own_loop and self._fits and not stop_strings
        kept = self._kept.call() if self._kept is not None else contextlib.nullcontext()
        # Seeded: a forked stream, so the caller's is untouched. Unseeded: the caller's own stream,
        # advanced, so that two unseeded calls draw differently (a fork would replay one draw).
        rng = torch.random.fork_rng(devices=self._rng_devices()) if seed is not None else contextlib.nullcontext()
        with rng, torch.no_grad(), kept:
            if seed is not None:
                torch.manual_seed(seed)
            for at in range(0, len(rows), size):
                chunk = rows[at : at + size]
                if any(not batch_token_ids[i] for i in chunk):
                    raise ValueError("empty prompt: generation needs at least one context token")
                prompts, chunk_limits = [list(batch_token_ids[i]) for i in chunk], [limits[i] for i in chunk]
                new = (self._decode(prompts, chunk_limits, temperature, top_p, stops) if own else
                       self._generate_chunk(prompts, chunk_limits, temperature, top_p, stops, tuple(stop_strings)))
                for i, ids in zip(chunk, new):
                    out[i] = cut_at_stop(ids, stops, limits[i])
        return out

    def _generate_chunk(self, prompts, limits, temperature, top_p, stops, stop_strings) -> list[list[int]]:
        width = max(map(len, prompts))
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        config = transformers.GenerationConfig(
            max_new_tokens=max(limits),
            eos_token_id=list(stops) or None,
            pad_token_id=self.pad_token_id,
            **_sampling_params(temperature, top_p),
        )
        extra: dict[str, Any] = {}
        if stop_strings:
            if self.tokenizer is None:
                raise ValueError("stop_strings need HFGenerator(tokenizer=...)")
            config.stop_strings = list(stop_strings)
            extra["tokenizer"] = self.tokenizer
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            generation_config=config,
            stopping_criteria=transformers.StoppingCriteriaList([_RowBudget(width, limits)]),
            past_key_values=growing_cache(self.model.config),
            **extra,
        )
        new = output[:, width:].tolist()
        if stop_strings:
            new = [cut_at_strings(ids, self.tokenizer, stop_strings) for ids in new]
        return new

    def _decode(self, prompts: list[list[int]], limits: list[int], temperature: float, top_p: float,
                stops: tuple[int, ...]) -> list[list[int]]:
        """The decoding loop (see the class docstring). Batch layout, per row: left padding, the
        reused prefix's KV, padding, the rest of the prompt, then the generated tokens; the
        attention mask marks the real positions and position ids count them, so padding anywhere
        changes nothing but cost."""
        model, device, pad = self.model, self.device, self.pad_token_id
        n = len(prompts)
        kept = self._kept
        hits = [kept.match(p) for p in prompts] if kept is not None else [(0, None)] * n
        reused = [k for k, _ in hits]
        rests = [p[k:] for p, k in zip(prompts, reused)]
        lc, lr = max(reused), max(map(len, rests))
        cache = growing_cache(model.config)
        if lc:
            shapes = next(kv for _, kv in hits if kv is not None)
            for layer, (k0, v0) in zip(cache.layers, shapes):
                keys = k0.new_zeros((n, k0.shape[0], lc, k0.shape[-1]))
                values = v0.new_zeros((n, v0.shape[0], lc, v0.shape[-1]))
                layer.update(keys, values)
            for i, (k, kv) in enumerate(hits):
                for layer, (k0, v0) in zip(cache.layers, kv or ()):
                    layer.keys[i, :, lc - k:, :] = k0[:, :k, :]
                    layer.values[i, :, lc - k:, :] = v0[:, :k, :]
        mask = torch.tensor([[0] * (lc - k) + [1] * k + [0] * (lr - len(r)) + [1] * len(r)
                             for k, r in zip(reused, rests)], device=device)
        ids = torch.tensor([[pad] * (lr - len(r)) + r for r in rests], device=device)
        # transformers' generate gives padding position 1; the real tokens count from the row's start
        positions = torch.tensor([[1] * (lr - len(r)) + list(range(k, k + len(r))) for k, r in zip(reused, rests)],
                                 device=device)
        nxt = torch.tensor([len(p) for p in prompts], device=device)
        rows = list(range(n))  # batch position -> row of the call
        new: list[list[int]] = [[] for _ in range(n)]
        finished: set[int] = set()  # rows done but still in the batch (fed padding, masked)
        stop_set = set(stops)
        while True:
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                        use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :]
            # Noise for every row of the call, finished or not, in one draw: the RNG stream of `generate`.
            noise = (torch.empty((n, logits.shape[-1]), dtype=torch.float32, device=device).exponential_(1)
                     if temperature > 0 else None)
            tokens = sample_tokens(logits, None if noise is None else noise[rows], temperature, top_p).tolist()
            for j, row in enumerate(rows):
                if row in finished:
                    continue
                new[row].append(tokens[j])
                if tokens[j] in stop_set or len(new[row]) >= limits[row]:
                    finished.add(row)
            if len(finished) == len(rows):
                break
            if 4 * len(finished) >= len(rows):  # compact: drop the finished rows and padding no row needs
                if kept is not None:
                    self._keep_rows(cache, mask, [(j, r) for j, r in enumerate(rows) if r in finished], prompts, new)
                stay = [j for j, r in enumerate(rows) if r not in finished]
                at = torch.tensor(stay, device=device)
                start = int(mask[at].argmax(1).min())
                room = max(limits[rows[j]] - len(new[rows[j]]) for j in stay) + 1
                for layer in cache.layers:
                    layer.keep(at, start, room)
                mask, nxt = mask[at, start:], nxt[at]
                rows = [rows[j] for j in stay]
                finished = set()
                tokens = [tokens[j] for j in stay]
            live = torch.tensor([r not in finished for r in rows], device=device)
            ids = torch.where(live, torch.tensor(tokens, device=device), pad).unsqueeze(-1)
            mask = torch.cat([mask, live.long().unsqueeze(-1)], 1)
            positions = torch.where(live, nxt, 1).unsqueeze(-1)
            nxt = nxt + live.long()
        if kept is not None:
            self._keep_rows(cache, mask, list(enumerate(rows)), prompts, new)
        return new

    def _keep_rows(self, cache, mask: torch.Tensor, rows: list[tuple[int, int]], prompts, new) -> None:
        """Hand the KV of `rows` ((batch position, row of the call)) to the next call: the sequence
        up to the last generated token, which was never run."""
        for j, row in rows:
            seq = prompts[row] + new[row][:-1]
            real = mask[j].nonzero().squeeze(-1)[: len(seq)]
            self._kept.current.append(
                (seq, [(layer.keys[j][:, real, :], layer.values[j][:, real, :]) for layer in cache.layers]))  # copies

    def _rng_devices(self) -> list[int]:
        device = self.device
        return [device.index or 0] if device.type == "cuda" else []


def _own_loop_fits(model) -> bool:
    """Whether `_decode` can drive `model`: every cache layer the growing full-attention layer, a
    forward that takes position ids and `logits_to_keep`, and no ZeRO-3 / FSDP sharding across
    ranks (each forward gathers parameters from every rank, so ranks must step together, as
    `generate`'s synced_gpus makes them; `_decode` lets a rank stop when its own rows have)."""
    import inspect

    from transformers.distributed.fsdp import is_fsdp_managed_module
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    layers = growing_cache(model.config).layers
    if not layers or not all(isinstance(layer, _GrowingKVLayer) for layer in layers):
        return False
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    accepts = inspect.signature(base.forward).parameters
    if not {"position_ids", "logits_to_keep", "past_key_values"} <= accepts.keys():
        return False
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    sharded = is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model)
    return not (sharded and distributed and torch.distributed.get_world_size() > 1)


def _sampling_params(temperature: float, top_p: float) -> dict[str, Any]:
    """Plain temperature / top-p sampling, every other logits processor explicitly off.

    `generate` fills each setting left unset (None) from the checkpoint's generation_config, and
    instruct checkpoints ship top_k, repetition_penalty and the like. An RL trainer scores the
    sampled tokens under the plain softmax policy, so the sampler must be exactly that policy.
    """
    neutral = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
    if temperature <= 0:
        return {"do_sample": False, **neutral}
    return {"do_sample": True, "temperature": float(temperature), "top_p": float(top_p), "top_k": 0,
            "min_p": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, **neutral}


def cut_at_strings(ids: list[int], tokenizer, stop_strings: Sequence[str]) -> list[int]:
    """Shortest prefix of `ids` whose text contains a stop string (all of `ids` if none does)."""
    def hit(k: int) -> bool:
        text = tokenizer.decode(ids[:k])
        return any(s in text for s in stop_strings)

    if not ids or not hit(len(ids)):
        return ids
    lo, hi = 1, len(ids)
    while lo < hi:  # containment grows with the prefix, so bisect for the first k that contains a stop
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    return ids[:lo]


def keep_prefixes(generator) -> contextlib.AbstractContextManager:
    """`generator.keep_prefixes()` where the backend has one (HFGenerator), else a no-op: the span
    of one multi-turn rollout, whose calls extend each other's sequences."""
    method = getattr(generator, "keep_prefixes", None)
    return method() if callable(method) else contextlib.nullcontext()


class CountingGenerator:
    """A Generator that counts its calls, sequences and new tokens and hands the counts to
    `on_call` after each call: progress for a rollout, which calls `generate` once per turn, without
    the engines knowing about logs. Other attributes (tokenizer, model, device) are the wrapped
    generator's."""

    def __init__(self, inner: Generator, on_call) -> None:
        self.inner = inner
        self.on_call = on_call
        self.counts = {"generate calls": 0, "sequences": 0, "new tokens": 0}

    def generate(self, batch_token_ids, max_new_tokens, *args, **kwargs) -> list[list[int]]:
        # Arguments pass through as given: callers and scripted generators differ in what they name.
        out = self.inner.generate(batch_token_ids, max_new_tokens, *args, **kwargs)
        self.counts["generate calls"] += 1
        self.counts["sequences"] += len(out)
        self.counts["new tokens"] += sum(map(len, out))
        self.on_call(dict(self.counts))
        return out

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


# --------------------------------------------------------------------------- OpenAI-compatible (vLLM)


def load_generator(model: str | Path, *, base_url: str | None = None, served_name: str | None = None):
    """(generator, tokenizer) for `model` (a checkpoint dir or hub id): loaded in process (HF, CPU),
    or, with `base_url`, behind that OpenAI-compatible completions endpoint serving it as
    `served_name` (default: `model`). Token ids go to the endpoint, so the tokenizer is `model`'s."""
    if not base_url:
        hf = HFGenerator.from_pretrained(model)
        return hf, hf.tokenizer
    return (OpenAICompletionsGenerator(base_url, served_name or str(model)),
            transformers.AutoTokenizer.from_pretrained(model))


class OpenAICompletionsGenerator:
    """POST {base_url}/v1/completions with token-id prompts (vLLM's OpenAI server).

    Sampled token ids come back exactly: the request sets vLLM's `return_token_ids` (each choice
    then has `token_ids`) and, for older servers, `return_tokens_as_token_ids` with `logprobs`
    (each `logprobs.tokens` entry is "token_id:<id>"). Re-encoding the returned text is possible
    (`retokenize_with=tokenizer`) but off by default: byte-level BPE does not always re-encode a
    decoded sequence to the same ids (merges across the turn boundary, partial UTF-8 at the end),
    which silently misaligns rewards, masks and log-probabilities with what was sampled.

    Batching: one request per distinct max_tokens with all those prompts, when unseeded or greedy
    (temperature 0: the seed changes nothing, and evaluation passes one). A seeded sampling call
    sends one request per row (seed + row index): vLLM applies a request's seed to every prompt in
    it, so the n identical prompts of a GRPO group would all get the same sample. Those requests go
    out `max_workers` at a time, and vLLM batches only what is in flight: the default puts up to 256
    rows of a rollout batch (prompts x G) in flight on a GPU server, where it was 32.

    Transport errors, 429 and 5xx are retried with exponential backoff; anything else, or
    exhausted retries, raises `GenerationBackendError` naming the URL, status and response body.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 600.0,
                 max_retries: int = 3, backoff_s: float = 1.0, logprobs: bool = True,
                 retokenize_with=None, max_workers: int = 256, transport: httpx.BaseTransport | None = None) -> None:
        from ragrl.http_retry import api_url

        self.url = api_url(base_url, "completions")
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.logprobs = logprobs
        self.retokenize_with = retokenize_with
        self.max_workers = max(1, max_workers)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx pools 100 connections by default: more workers than that would queue on the pool.
        # (A `transport` given, as tests do, brings its own pool and these limits do not apply.)
        limits = httpx.Limits(max_connections=self.max_workers, max_keepalive_connections=self.max_workers)
        self.client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport, limits=limits)

    def close(self) -> None:
        self.client.close()

    def generate(self, batch_token_ids, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, *,
                 stop_token_ids=(), stop_strings=()) -> list[list[int]]:
        limits = row_limits(max_new_tokens, len(batch_token_ids))
        out: list[list[int]] = [[] for _ in batch_token_ids]
        if seed is None or temperature <= 0:
            groups: dict[int, list[int]] = {}
            for i, lim in enumerate(limits):
                if lim > 0:
                    groups.setdefault(lim, []).append(i)
            jobs = [(rows, lim, None) for lim, rows in groups.items()]
        else:
            jobs = [([i], lim, seed + i) for i, lim in enumerate(limits) if lim > 0]
        stops = list(dict.fromkeys(int(t) for t in stop_token_ids))

        def run(job):
            rows, lim, row_seed = job
            body = self.request_body([batch_token_ids[i] for i in rows], lim, temperature, top_p, row_seed,
                                     stops, list(stop_strings))
            return rows, lim, self.parse_response(self._post(body), len(rows))

        if len(jobs) <= 1:  # none when every row's budget is 0
            results = [run(job) for job in jobs]
        else:
            with concurrent.futures.ThreadPoolExecutor(min(self.max_workers, len(jobs))) as pool:
                results = list(pool.map(run, jobs))
        for rows, lim, new in results:
            for i, ids in zip(rows, new):
                out[i] = cut_at_stop(ids, stops, lim)
        return out

    def request_body(self, prompts: list[list[int]], max_tokens: int, temperature: float, top_p: float,
                     seed: int | None, stop_token_ids: list[int], stop_strings: list[str]) -> dict:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [list(map(int, p)) for p in prompts],
            "max_tokens": int(max_tokens),
            "temperature": float(temperature),
            "top_p": float(top_p),
            "n": 1,
            "stream": False,
            # vLLM extensions; the closing tag must stay in the output so the turn can be parsed.
            "stop_token_ids": stop_token_ids,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "return_token_ids": True,
        }
        if stop_strings:
            body["stop"] = stop_strings
        if self.logprobs:
            body["logprobs"] = 0
            body["return_tokens_as_token_ids"] = True
        if seed is not None:
            body["seed"] = int(seed)
        return body

    def parse_response(self, payload: Any, n_prompts: int) -> list[list[int]]:
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not isinstance(choices, list) or len(choices) != n_prompts:
            got = len(choices) if isinstance(choices, list) else "no"
            raise GenerationBackendError(f"{self.url}: {got} choices for {n_prompts} prompts: {str(payload)[:300]}")
        out: list[list[int] | None] = [None] * n_prompts
        for pos, choice in enumerate(choices):
            index = choice.get("index", pos) if isinstance(choice, dict) else pos
            if not isinstance(index, int) or not 0 <= index < n_prompts or out[index] is not None:
                raise GenerationBackendError(f"{self.url}: bad or repeated choice index {index!r}")
            out[index] = self._choice_ids(choice)
        return out  # type: ignore[return-value]

    def _choice_ids(self, choice: Any) -> list[int]:
        if not isinstance(choice, dict):
            raise GenerationBackendError(f"{self.url}: choice is not an object: {str(choice)[:200]}")
        ids = choice.get("token_ids")
        if isinstance(ids, list) and all(isinstance(t, int) for t in ids):
            return ids
        tokens = (choice.get("logprobs") or {}).get("tokens")
        if isinstance(tokens, list) and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            try:
                return [int(t[len("token_id:"):]) for t in tokens]
            except ValueError as exc:
                raise GenerationBackendError(f"{self.url}: unreadable token id in {tokens[:5]}") from exc
        if self.retokenize_with is not None and isinstance(choice.get("text"), str):
            return self.retokenize_with.encode(choice["text"], add_special_tokens=False)
        raise GenerationBackendError(
            f"{self.url}: the response has no token ids (neither choices[].token_ids nor "
            "logprobs.tokens as 'token_id:N'); use a vLLM server that supports return_token_ids or "
            "return_tokens_as_token_ids, or pass retokenize_with=tokenizer to accept inexact re-encoding"
        )

    def _post(self, body: dict) -> Any:
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self.client.post(self.url, json=body)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code == 429 or response.status_code >= 500:
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code != 200:
                raise GenerationBackendError(
                    f"POST {self.url} failed with HTTP {response.status_code}: {response.text[:500]}"
                )
            try:
                return response.json()
            except ValueError as exc:
                raise GenerationBackendError(f"POST {self.url}: response is not JSON: {response.text[:300]}") from exc
        raise GenerationBackendError(f"POST {self.url} failed after {self.max_retries + 1} attempts; last error: {last}")
