"""Merge a LoRA adapter into its base model, giving a plain HF checkpoint for vLLM and evaluation.

One rule for both kinds of training output: if `adapter_dir` holds a LoRA adapter
(`adapter_config.json`), the merged model is written; if it holds a full model (full fine-tuning),
it is copied through unchanged. Downstream steps then always read a full checkpoint.

The output is written atomically (all or nothing), in safetensors, with the tokenizer: the
adapter's own copy when it has one (SFT saves the tokenizer it trained with), else the base's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ragrl import hostinfo
from ragrl.io import atomic_dir

ADAPTER_CONFIG = "adapter_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def merge_lora(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path, *, dtype: str = "auto") -> Path:
    """Write base + adapter (merged) to `out_dir`, or copy a full model in `adapter_dir` through."""
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    if not adapter_dir.is_dir():
        raise FileNotFoundError(f"{adapter_dir}: no such directory (expected a LoRA adapter or a full model)")
    if not is_adapter(adapter_dir):
        if not (adapter_dir / "config.json").is_file():
            raise FileNotFoundError(f"{adapter_dir}: neither a LoRA adapter ({ADAPTER_CONFIG}) "
                                    "nor a model (config.json)")
        with atomic_dir(out_dir) as tmp:
            shutil.copytree(adapter_dir, tmp, dirs_exist_ok=True)
        return out_dir
    model, tokenizer = load_merged(base_dir, adapter_dir, dtype=dtype)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if (adapter_dir / hostinfo.RECORD).is_file():  # the hosts that trained the adapter
            shutil.copyfile(adapter_dir / hostinfo.RECORD, tmp / hostinfo.RECORD)
    return out_dir


def load_merged(base_dir: str | Path, adapter_dir: str | Path, *, dtype: str = "auto"):
    """(merged model, tokenizer) in memory; the base is loaded from `base_dir`, whatever path the
    adapter config recorded at training time (runs move between machines)."""
    import transformers
    from peft import PeftModel

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
    model = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    has_tokenizer = all((Path(adapter_dir) / f).is_file() for f in TOKENIZER_FILES)
    tokenizer = transformers.AutoTokenizer.from_pretrained(adapter_dir if has_tokenizer else base_dir)
    return model.eval(), tokenizer
