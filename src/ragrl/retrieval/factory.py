"""FAISS index_factory strings checked without data, so a typo fails at config time.

`ragrl.workflow` imports this while Snakemake builds the DAG: it needs faiss (~0.15 s to import,
no torch) and nothing else from the package. A factory is parsed by building the empty index,
which allocates nothing that grows with a corpus.
"""

from __future__ import annotations

import re

# The embedding size is only known once the encoder is loaded; a string that parses for none of
# the common sizes (MiniLM 384, BERT/E5-base 768, Qwen2-0.5B 896, E5-large 1024, 1536, Qwen2-7B
# 3584, 4096) is wrong whatever the encoder. Small first: an empty OPQ index allocates d x d floats.
DIMENSIONS = (384, 768, 896, 1024, 1536, 3584, 4096)


def factory_error(factory: str, dims: tuple[int, ...] = DIMENSIONS) -> str | None:
    """None when FAISS accepts `factory` for one of `dims`; else FAISS's reason, without its C++
    location. None, too, where faiss is not installed (the index job checks again)."""
    try:
        import faiss
    except ImportError:
        return None
    if not isinstance(factory, str) or not factory.strip():
        return "must be a non-empty FAISS index_factory string"
    reason = ""
    for dim in dims:
        try:
            faiss.index_factory(dim, factory)
            return None
        except RuntimeError as exc:
            reason = reason or faiss_reason(str(exc))
    return f"FAISS cannot build {factory!r} for embedding sizes {list(dims)}: {reason}"


def faiss_reason(message: str) -> str:
    # "Error in <signature> at /project/faiss/index_factory.cpp:1228: could not parse ..." → the end.
    match = re.search(r"\.(?:cpp|h):\d+: (.*)", message, re.S)
    return (match.group(1) if match else message).strip().splitlines()[0]
