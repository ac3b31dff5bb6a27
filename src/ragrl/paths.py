"""The file layout each stage produces, in one place.

Both the stages (which write these files) and the Snakemake rules (which declare them as outputs)
read it, so the two cannot drift apart. Standard library only: the Snakefile imports it.
"""

from __future__ import annotations

import os
import re

SPLITS = ("train", "dev", "test")
KGS = ("A", "B")


def world_files() -> list[str]:
    """Every file `ragrl world` writes, relative to its output directory."""
    files = ["passages.parquet", "entities.parquet", "relations.parquet", "kb/documents.parquet",
             "kg/A/triples.parquet", "kg/B/triples.parquet", "manifest.json"]
    for split in SPLITS:
        files += [f"qa/{split}.parquet", f"factual/{split}.parquet"]
        files += [f"kgqa/{kg}/{split}.parquet" for kg in KGS]
    return files


def hf_model_files() -> list[str]:
    """The files of a saved Hugging Face causal LM + tokenizer (safetensors, no pickle)."""
    return ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


DENSE_INDEX_FILES = ("index.faiss", "meta.json")


def relative_to_dir(path: str | os.PathLike, directory: str | os.PathLike) -> str:
    """`path` as seen from `directory`: how an index records its passages file, so that the index
    loads from any working directory and still loads when the results tree is moved as a whole."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(directory))


_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]")


def safe_name(name: str) -> str:
    """A file-name-safe version of a run or metric name (`recall@5` -> `recall_5`): the plots'
    file names, which the rules declare too."""
    out = _UNSAFE.sub("_", name)
    return "_" + out if out.startswith(".") or not out else out
