"""In-process retrieval: one `Searcher.search(queries, topk)` over dense, BM25 or hybrid retrieval.

Hybrid mode uses reciprocal-rank fusion (RRF, Cormack et al. 2009): score = sum over retrievers of
1 / (rrf_k + rank). BM25 scores are unbounded and vary per query while cosine scores sit in a
narrow band, so score normalisation needs per-corpus tuning; RRF uses ranks only and has one
insensitive constant (60, the paper's value).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragrl.errors import InputError
from ragrl.retrieval import Hit
from ragrl.retrieval.dense import DEFAULT_EF_SEARCH, DEFAULT_NPROBE, META_FILE, DenseIndex, load_faiss_index
from ragrl.retrieval.encoder import Encoder
from ragrl.retrieval.gpu import query_device
from ragrl.retrieval.sparse import BM25Index, load_bm25

MODES = ("dense", "bm25", "hybrid")
RRF_K = 60


class PassageStore:
    """Passages by integer row, kept as Arrow columns (a few buffers, not one Python object per row)."""

    COLUMNS = ("id", "title", "text")

    def __init__(self, table: pa.Table) -> None:
        missing = set(self.COLUMNS) - set(table.column_names)
        if missing:
            raise InputError(f"passages table lacks columns {sorted(missing)}")
        self.table = table.select(list(self.COLUMNS)).combine_chunks()

    @classmethod
    def from_parquet(cls, path: str | Path) -> PassageStore:
        return cls(pq.read_table(path, columns=list(cls.COLUMNS)))

    def __len__(self) -> int:
        return self.table.num_rows

    def rows(self, rows: Sequence[int]) -> list[tuple[str, str, str]]:
        """(id, title, text) for each row, in the given order."""
        taken = self.table.take(pa.array(np.asarray(rows, dtype=np.int64)))
        return list(zip(*(taken[c].to_pylist() for c in self.COLUMNS), strict=True))


class DenseRetriever:
    """Encoder + FAISS index; a batch of queries is one encode call and one index search."""

    def __init__(self, encoder: Encoder, index: DenseIndex) -> None:
        for key in ("query_prefix", "passage_prefix", "model"):
            built, now = index.meta.get(key), getattr(encoder, "model_name" if key == "model" else key)
            if built is not None and built != now:
                raise InputError(f"index was built with {key}={built!r} but the encoder uses {now!r}")
        self.encoder = encoder
        self.index = index

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(self.encoder.encode_queries(queries), k)


Ranked = list[list[tuple[int, float]]]  # per query: (row, score), best first


class Searcher:
    def __init__(
        self,
        passages: PassageStore,
        dense: DenseRetriever | None = None,
        bm25: BM25Index | None = None,
        mode: str | None = None,
        *,
        fusion_depth: int = 100,
        rrf_k: int = RRF_K,
    ) -> None:
        mode = mode or ("hybrid" if dense and bm25 else "dense" if dense else "bm25")
        if mode not in MODES:
            raise InputError(f"mode must be one of {MODES}, got {mode!r}")
        if mode in ("dense", "hybrid") and dense is None:
            raise InputError(f"mode {mode!r} needs a dense index")
        if mode in ("bm25", "hybrid") and bm25 is None:
            raise InputError(f"mode {mode!r} needs a BM25 index")
        for name, part in (("dense", dense and dense.index), ("bm25", bm25)):
            if part is not None and part.ntotal != len(passages):
                raise InputError(f"{name} index has {part.ntotal} rows but the passages have {len(passages)}")
        self.passages = passages
        self.dense = dense
        self.bm25 = bm25
        self.mode = mode
        # Fusion depth does not depend on topk, so a query's top-3 is a prefix of its top-10: the
        # service can answer a micro-batch with mixed topk values from one search at the largest.
        self.fusion_depth = fusion_depth
        self.rrf_k = rrf_k

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        queries = list(queries)
        if topk < 1:
            raise InputError(f"topk must be >= 1, got {topk}")
        if not queries:
            return []
        if self.mode == "dense":
            ranked = _ranked(*self.dense.search(queries, topk))
        elif self.mode == "bm25":
            ranked = _matching(_ranked(*self.bm25.search(queries, topk)))
        else:
            depth = max(topk, self.fusion_depth)
            lexical = _matching(_ranked(*self.bm25.search(queries, depth)))
            ranked = rrf([_ranked(*self.dense.search(queries, depth)), lexical], topk, self.rrf_k)
        return self._hits(ranked)

    def _hits(self, ranked: Ranked) -> list[list[Hit]]:
        # One Arrow `take` for the whole batch rather than one per query.
        flat = [row for per_query in ranked for row, _ in per_query]
        docs = iter(self.passages.rows(flat))
        out = []
        for per_query in ranked:
            out.append([Hit(*next(docs), score=float(score)) for _, score in per_query])
        return out

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"mode": self.mode, "num_passages": len(self.passages)}
        if self.dense is not None:
            meta = self.dense.index.meta
            info["dense"] = {
                **{k: meta.get(k) for k in ("factory", "metric", "dim", "ntotal", "model", "query_prefix", "passage_prefix")},
                "search_params": self.dense.index.search_params,
            }
        if self.bm25 is not None:
            info["bm25"] = {k: self.bm25.meta.get(k) for k in ("num_passages", "k1", "b", "method", "stemmer", "vocab_size")}
        if self.mode == "hybrid":
            info["fusion"] = {"method": "rrf", "k": self.rrf_k, "depth": self.fusion_depth}
        return info


def _ranked(scores: np.ndarray, rows: np.ndarray) -> Ranked:
    # faiss pads with -1 when an approximate index finds fewer than k neighbours.
    return [[(int(r), float(s)) for s, r in zip(sc, rw) if r >= 0] for sc, rw in zip(scores, rows)]


def _matching(ranked: Ranked) -> Ranked:
    """BM25 rows that match at least one query term. BM25 pads with zero-score rows (whatever rows
    come first in the corpus); a blank or unmatched query gets no hits, as from Search-R1's
    pyserini server, and in fusion the padding must not vote."""
    return [[(r, s) for r, s in per_q if s > 0] for per_q in ranked]


def rrf(rankings: Sequence[Ranked], topk: int, k: int = RRF_K) -> Ranked:
    """Reciprocal-rank fusion of several per-query rankings; ties go to the lower row."""
    fused: Ranked = []
    for per_query in zip(*rankings):
        scores: dict[int, float] = {}
        for ranking in per_query:
            for rank, (row, _) in enumerate(ranking, start=1):
                scores[row] = scores.get(row, 0.0) + 1.0 / (k + rank)
        fused.append(sorted(scores.items(), key=lambda rs: (-rs[1], rs[0]))[:topk])
    return fused


def _meta(index_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(index_dir) / META_FILE).read_text())


def _passages_path(recorded: str | None, index_dir: Path) -> Path:
    if not recorded:
        raise InputError(f"{index_dir / META_FILE} records no passages file; give it with --passages")
    # Meta records the path relative to the index dir (or absolute); indexes built before that
    # recorded it relative to the directory they were built from, tried last.
    for candidate in (index_dir / recorded, Path(recorded)):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"passages file {recorded!r} recorded in {index_dir / META_FILE} not found "
                            f"(from {index_dir}); give the passages parquet with --passages")


def load_searcher(
    index_dir: str | Path | None = None,
    bm25_dir: str | Path | None = None,
    mode: str | None = None,
    *,
    passages: str | Path | None = None,
    device: str | None = None,
    batch_size: int = 64,
    use_gpu: bool | None = False,
    nprobe: int | None = DEFAULT_NPROBE,
    ef_search: int | None = DEFAULT_EF_SEARCH,
    fusion_depth: int = 100,
) -> Searcher:
    """Load a Searcher from a dense index dir and/or a BM25 dir (either may be given as `index_dir`;
    meta.json's `kind` tells them apart). The encoder is rebuilt from the dense meta (model name,
    prefixes, max length), so queries are encoded exactly as the passages were."""
    dirs = [Path(d) for d in (index_dir, bm25_dir) if d is not None]
    if not dirs:
        raise InputError("load_searcher needs index_dir and/or bm25_dir")
    by_kind: dict[str, Path] = {}
    for d in dirs:
        kind = _meta(d).get("kind")
        if kind not in ("dense", "bm25") or kind in by_kind:
            raise InputError(f"{d}: unexpected or duplicate index kind {kind!r}")
        by_kind[kind] = d

    dense = bm25 = None
    if "dense" in by_kind:
        index = load_faiss_index(by_kind["dense"], use_gpu=use_gpu, nprobe=nprobe, ef_search=ef_search)
        meta = index.meta
        if not meta.get("model"):
            raise InputError(f"{by_kind['dense']}: meta names no encoder model; cannot encode queries")
        encoder = Encoder(
            meta["model"],
            query_prefix=meta.get("query_prefix", ""),
            passage_prefix=meta.get("passage_prefix", ""),
            batch_size=batch_size,
            max_length=meta.get("max_length"),
            normalize=meta.get("normalize", True),
            device=query_device(use_gpu, device),
        )
        dense = DenseRetriever(encoder, index)
    if "bm25" in by_kind:
        bm25 = load_bm25(by_kind["bm25"])
    if passages is None:
        first = dirs[0]
        passages = _passages_path(_meta(first).get("passages"), first)
    return Searcher(PassageStore.from_parquet(passages), dense, bm25, mode, fusion_depth=fusion_depth)
