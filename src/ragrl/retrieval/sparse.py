"""BM25 retrieval with bm25s.

Storage: bm25s 0.3.16's own `save` writes the score matrix as three CSC arrays with
`np.save(..., allow_pickle=False)` plus JSON (vocabulary, parameters), and its `Tokenizer` saves
its vocabulary and stopwords as JSON. No pickle anywhere, so we use those formats as they are and
load everything back with allow_pickle=False; `build_bm25` re-checks the written arrays so that a
future bm25s that started pickling would fail the build instead of shipping an unsafe index.

Tokenising is done by our own `bm25s.tokenization.Tokenizer` (English stopwords, PyStemmer's
English stemmer only when that package is already installed) into integer ids; queries go through
the same tokenizer, so the index never needs its duplicate string vocabulary in memory.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from ragrl.errors import InputError
from ragrl.io import atomic_dir, write_json
from ragrl.paths import relative_to_dir
from ragrl.progress import progress
from ragrl.retrieval.encoder import passage_contents

META_FILE = "meta.json"
STOPWORDS = "en"


def load_stemmer(name: str | None):
    """PyStemmer's stemmer for `name`, or None. "auto" means English if PyStemmer is installed."""
    if name in (None, "none", ""):
        return None
    try:
        import Stemmer  # PyStemmer: optional, never installed on demand
    except ImportError:
        if name == "auto":
            return None
        raise InputError(f"BM25 stemmer {name!r} needs the PyStemmer package, which is not installed") from None
    return Stemmer.Stemmer("english" if name == "auto" else name)


def _make_tokenizer(stemmer):
    import bm25s.tokenization

    return bm25s.tokenization.Tokenizer(stopwords=STOPWORDS, stemmer=stemmer)


def build_bm25(
    passages_parquet: str | Path,
    out_dir: str | Path,
    *,
    k1: float = 1.5,
    b: float = 0.75,
    method: str = "lucene",
    stemmer: str | None = "auto",
    batch_rows: int = 50_000,
) -> dict[str, Any]:
    """Index "{title}\\n{text}" of every passage (row order = document id) into `out_dir`."""
    import bm25s

    started = time.monotonic()
    stem = load_stemmer(stemmer)
    tokenizer = _make_tokenizer(stem)
    pf = pq.ParquetFile(passages_parquet)
    n = pf.metadata.num_rows
    if n == 0:
        raise InputError(f"{passages_parquet}: no passages to index")
    doc_ids: list[list[int]] = []
    batches = pf.iter_batches(batch_size=batch_rows, columns=["title", "text"])
    for batch in progress(batches, desc="bm25 tokenize", total=math.ceil(n / batch_rows), unit="batch"):
        texts = passage_contents(batch)
        doc_ids.extend(tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False))

    retriever = bm25s.BM25(k1=k1, b=b, method=method)
    retriever.index((doc_ids, tokenizer.get_vocab_dict()), show_progress=False)
    del doc_ids
    meta = {
        "kind": "bm25",
        "passages": relative_to_dir(passages_parquet, out_dir),
        "num_passages": n,
        "k1": k1,
        "b": b,
        "method": method,
        "stopwords": STOPWORDS,
        "stemmer": None if stem is None else ("english" if stemmer == "auto" else stemmer),
        "vocab_size": len(tokenizer.get_vocab_dict()),
        "bm25s_version": bm25s.__version__,
        "build_seconds": round(time.monotonic() - started, 3),
    }
    with atomic_dir(out_dir) as tmp:
        retriever.save(tmp, show_progress=False)  # no corpus: passages stay in the parquet
        tokenizer.save_vocab(tmp)
        tokenizer.save_stopwords(tmp)
        _check_no_pickle(tmp)
        write_json(meta, tmp / META_FILE)
    return meta


def _check_no_pickle(directory: Path) -> None:
    for path in directory.iterdir():
        if path.suffix == ".npy":
            # Raises for object arrays, i.e. anything that would need pickle to read back.
            np.load(path, mmap_mode="r", allow_pickle=False)
        elif path.suffix != ".json":
            raise RuntimeError(f"bm25s wrote {path.name}, which is neither .npy nor .json; refusing to ship it")


class BM25Index:
    """A loaded BM25 index: tokenise queries, score all passages, return top-k rows."""

    def __init__(self, retriever, tokenizer, meta: dict[str, Any]) -> None:
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.meta = meta
        # The tokenizer memoises new surface forms of known stems even with update_vocab=False.
        self._lock = threading.Lock()

    @property
    def ntotal(self) -> int:
        return int(self.meta["num_passages"])

    def tokenize(self, queries: list[str]) -> list[list[int]]:
        with self._lock:
            return self.tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (len(queries), k'), k' = min(k, passages); ties go to the lower row."""
        k = max(1, min(k, self.ntotal))
        scores = np.empty((len(queries), k), dtype=np.float32)
        rows = np.empty((len(queries), k), dtype=np.int64)
        for i, ids in enumerate(self.tokenize(queries)):
            all_scores = self.retriever.get_scores_from_ids(ids) if ids else np.zeros(self.ntotal, np.float32)
            rows[i] = _topk(all_scores, k)
            scores[i] = all_scores[rows[i]]
        return scores, rows


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    if k < len(scores):
        # argpartition picks arbitrary rows among ties at the k-th score; take the lowest instead so
        # results do not depend on numpy's selection algorithm.
        kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
        above = np.flatnonzero(scores > kth)
        candidates = np.concatenate([above, np.flatnonzero(scores == kth)[: k - len(above)]])
    else:
        candidates = np.arange(len(scores))
    # lexsort: last key is primary, so sort by score descending, then row ascending
    return candidates[np.lexsort((candidates, -scores[candidates]))]


def load_bm25(index_dir: str | Path, *, mmap: bool = False) -> BM25Index:
    import bm25s

    index_dir = Path(index_dir)
    meta = json.loads((index_dir / META_FILE).read_text())
    if meta.get("kind") != "bm25":
        raise InputError(f"{index_dir}: not a BM25 index (meta kind={meta.get('kind')!r})")
    tokenizer = _make_tokenizer(load_stemmer(meta["stemmer"]))
    tokenizer.load_vocab(index_dir)
    tokenizer.load_stopwords(index_dir)
    # load_vocab=False: queries arrive as ids from our tokenizer, so the string vocab is not needed.
    retriever = bm25s.BM25.load(index_dir, mmap=mmap, allow_pickle=False, load_vocab=False, show_progress=False)
    return BM25Index(retriever, tokenizer, meta)
