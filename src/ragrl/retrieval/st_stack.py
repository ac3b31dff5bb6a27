"""Sentence-transformers stacks run on plain transformers, bit for bit.

Importing `sentence_transformers` (6.x) drags in its training stack (sklearn, scipy, pandas,
datasets, peft...): about 3.5 s of CPU per process on top of torch + transformers, paid by every
job that encodes queries, hundreds of times per test run. For the common stacks (Transformer ->
mean/cls Pooling -> optional Normalize) this module replays exactly what
`SentenceTransformer.encode` computes, so the outputs stay identical (np.array_equal) and an index
built by either path is searched the same way. Anything it cannot replay exactly returns None from
`load_plain_stack` and the caller uses SentenceTransformer itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

# The type names ST writes to modules.json: the legacy aliases, and ST 6's module paths.
_TYPES = {
    "Transformer": {
        "sentence_transformers.models.Transformer",
        "sentence_transformers.base.modules.Transformer",
        "sentence_transformers.base.modules.transformer.Transformer",
    },
    "Pooling": {
        "sentence_transformers.models.Pooling",
        "sentence_transformers.sentence_transformer.modules.Pooling",
        "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    },
    "Normalize": {
        "sentence_transformers.models.Normalize",
        "sentence_transformers.base.modules.Normalize",
        "sentence_transformers.base.modules.normalize.Normalize",
    },
}
# Encoder-only architectures that ST loads with AutoModel and runs through `forward` (none of its
# seq2seq-encoder, multimodal or remote-code special cases); each checked bit for bit against ST.
_MODEL_TYPES = {"bert", "roberta", "xlm-roberta", "mpnet"}
# ST's legacy pooling flags, in ST's order (sentence_transformer/modules/pooling.py).
_LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# The names ST tries, in its order (Transformer.load_config).
_SBERT_CONFIGS = tuple(
    f"sentence_{name}_config.json"
    for name in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
)
_NORMALIZE_KEYS = ("module_input_name", "module_output_name")
_EMPTY_KWARGS = ("model_args", "tokenizer_args", "config_args", "model_kwargs", "processor_kwargs", "config_kwargs")
_FORWARD_SAFETY_NET = {"input_ids", "attention_mask", "token_type_ids", "inputs_embeds", "return_dict"}
_TEXT_FORWARD = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf8")) if path.is_file() else None


def _pooling_mode(cfg: dict[str, Any]) -> str | None:
    cfg = dict(cfg)
    legacy = [k for k in _LEGACY_POOLING if k in cfg]
    if legacy and "pooling_mode" not in cfg:
        modes = [mode for key, mode in _LEGACY_POOLING.items() if cfg.get(key, False)]
        cfg["pooling_mode"] = modes or ["mean"]  # ST's default when no flag is set
    for k in legacy:
        del cfg[k]
    mode = cfg.pop("pooling_mode", "mean")
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    cfg.pop("embedding_dimension", None)
    cfg.pop("word_embedding_dimension", None)
    cfg.pop("include_prompt", None)  # only matters with a prompt, which the plain path never has
    if cfg or mode not in ("mean", "cls"):
        return None
    return mode


def plain_stack_plan(path: str) -> dict[str, Any] | None:
    """What the plain path needs from `path`'s ST config files, or None when ST must run it."""
    root = Path(path)
    modules = _read(root / "modules.json")
    if not isinstance(modules, list) or len(modules) not in (2, 3):
        return None
    kinds = ["Transformer", "Pooling", "Normalize"][: len(modules)]
    for module, kind in zip(modules, kinds):
        if module.get("type") not in _TYPES[kind] or module.get("kwargs"):
            return None
    if modules[0].get("path", "") != "":
        return None
    st_config = _read(root / "config_sentence_transformers.json") or {}
    if st_config.get("default_prompt_name") or st_config.get("requirements"):
        return None
    if st_config.get("model_type", "SentenceTransformer") != "SentenceTransformer":
        return None
    sbert = dict(next((c for c in (_read(root / name) for name in _SBERT_CONFIGS) if c), {}))
    max_seq_length = sbert.pop("max_seq_length", None)
    if sbert.pop("do_lower_case", False) or any(sbert.pop(k, {}) for k in _EMPTY_KWARGS):
        return None
    if sbert.pop("transformer_task", "feature-extraction") != "feature-extraction":
        return None
    if sbert.pop("modality_config", _TEXT_FORWARD) != _TEXT_FORWARD:
        return None
    if sbert.pop("module_output_name", "token_embeddings") != "token_embeddings" or sbert:
        return None
    pooling = _read(root / modules[1].get("path", "") / "config.json")
    mode = _pooling_mode(pooling) if isinstance(pooling, dict) else None
    if mode is None:
        return None
    if len(modules) == 3:
        norm = _read(root / modules[2].get("path", "") / "config.json") or {}
        if any(norm.get(k, "sentence_embedding") != "sentence_embedding" for k in _NORMALIZE_KEYS) or (
            set(norm) - set(_NORMALIZE_KEYS)
        ):
            return None
    hf_config = _read(root / "config.json") or {}
    if hf_config.get("model_type") not in _MODEL_TYPES or hf_config.get("auto_map"):
        return None
    if pooling.get("embedding_dimension", pooling.get("word_embedding_dimension")) != hf_config.get("hidden_size"):
        return None
    return {"max_seq_length": max_seq_length, "pooling": mode, "normalize": len(modules) == 3}


class PlainStack:
    """The slice of SentenceTransformer's API that `Encoder` uses, replayed on transformers."""

    def __init__(self, path: str, plan: dict[str, Any], device: str) -> None:
        import inspect

        import torch
        from transformers import AutoModel, AutoTokenizer

        self._torch = torch
        self.device = device
        self.pooling = plan["pooling"]
        self.normalize = plan["normalize"]
        # As ST's Transformer module: a saved max_seq_length becomes the tokenizer's
        # model_max_length; otherwise the tokenizer's own, capped at the position table.
        if plan["max_seq_length"] is not None:
            self.tokenizer = AutoTokenizer.from_pretrained(path, model_max_length=plan["max_seq_length"])
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(device).eval()
        max_pos = getattr(self.model.config, "max_position_embeddings", -1)
        if plan["max_seq_length"] is None and max_pos is not None and max_pos != -1:
            self.tokenizer.model_max_length = min(self.tokenizer.model_max_length, max_pos)
        # ST's filter of tokenizer outputs (Transformer.forward): all when forward takes **kwargs,
        # else its declared parameters plus ST's safety net.
        params = inspect.signature(self.model.forward).parameters
        has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._forward_keys = None if has_var_kw else set(params) | _FORWARD_SAFETY_NET
        self.dim = int(self.model.config.hidden_size)

    @property
    def max_seq_length(self) -> int:
        return self.tokenizer.model_max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self.tokenizer.model_max_length = value

    def get_embedding_dimension(self) -> int:
        return self.dim

    def encode(self, texts: list[str], *, batch_size: int, normalize_embeddings: bool, **_: Any) -> np.ndarray:
        torch = self._torch
        F = torch.nn.functional
        order = np.argsort([-len(t) for t in texts])  # ST's batching order: batch contents change padding
        out: list[Any] = [None] * len(texts)
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                idx = order[start : start + batch_size]
                features = self.tokenizer(
                    [texts[i] for i in idx], padding=True, truncation="longest_first", return_tensors="pt"
                )
                if self._forward_keys is not None:
                    features = {k: v for k, v in features.items() if k in self._forward_keys}
                features = {k: v.to(self.device) for k, v in features.items()}
                h = self.model(**features, return_dict=True).last_hidden_state
                e = self._pool(h, features["attention_mask"])
                if self.normalize:
                    e = F.normalize(e, p=2, dim=-1)
                if normalize_embeddings:  # ST normalises again on top of the Normalize module
                    e = F.normalize(e, p=2, dim=1)
                e = e.cpu()
                for j, i in enumerate(idx):
                    out[i] = e[j]
        emb = torch.stack(out)
        return (emb.float() if emb.dtype == torch.bfloat16 else emb).numpy()

    def _pool(self, h: Any, attention_mask: Any) -> Any:
        # Pooling._forward_padded of sentence-transformers 6, for one mode and no prompt.
        torch = self._torch
        if self.pooling == "cls":
            first = attention_mask.to(torch.int).argmax(dim=1)
            index = first.unsqueeze(-1).unsqueeze(1).expand(-1, 1, h.shape[-1])
            return torch.gather(h, 1, index).squeeze(1)
        acc = torch.float32 if h.dtype in (torch.float16, torch.bfloat16) else h.dtype
        mask = attention_mask.unsqueeze(-1).to(h.dtype)
        total = (h * mask).sum(dim=1, dtype=acc)
        count = torch.clamp(mask.sum(dim=1, dtype=acc), min=1e-9)
        return (total / count).to(h.dtype)


def load_plain_stack(path: str, device: str) -> PlainStack | None:
    if not Path(path).is_dir():
        return None  # a hub id: ST resolves and downloads it
    plan = plain_stack_plan(path)
    return PlainStack(path, plan, device) if plan is not None else None
