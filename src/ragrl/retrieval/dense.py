"""Dense retrieval: sharded passage embedding and a streamed FAISS index build.

Embedding a full Wikipedia dump is the expensive step, so it is split into contiguous row ranges
that run as independent cluster jobs (`embed_shard`). Each shard is an .npy file (so it can be
memory-mapped) plus a sidecar JSON naming its row range and how it was encoded; the index build
checks those sidecars so that shards from different models or a missing shard cannot produce an
index whose row ids point at the wrong passages.

The build never holds all embeddings at once: a bounded random sample is read for training (on the
GPUs with retrieval.gpu, or by default when faiss sees one), then shards are memory-mapped and added chunk by chunk on the CPU, so peak
memory is about the final index size.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragrl.errors import InputError
from ragrl.io import atomic_dir, atomic_path, write_json
from ragrl.paths import relative_to_dir
from ragrl.progress import progress
from ragrl.retrieval.factory import faiss_reason
from ragrl.retrieval.gpu import faiss_on_gpu, job_gpu_devices
from ragrl.retrieval.encoder import Encoder, passage_contents

INDEX_FILE = "index.faiss"
META_FILE = "meta.json"
METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}
# Sidecar fields that must agree across shards for their rows to share one vector space.
_ENCODING_KEYS = ("model", "query_prefix", "passage_prefix", "normalize", "max_length", "dim")
DEFAULT_NPROBE = 32
DEFAULT_EF_SEARCH = 128


# --------------------------------------------------------------------------- sharded embedding


def shard_range(num_rows: int, shard: int, num_shards: int) -> tuple[int, int]:
    """Rows [start, stop) of `shard`: contiguous, covering all rows, sizes differing by at most 1."""
    if num_shards < 1:
        raise InputError(f"num_shards must be >= 1, got {num_shards}")
    if not 0 <= shard < num_shards:
        raise InputError(f"shard must be in [0, {num_shards}), got {shard}")
    return shard * num_rows // num_shards, (shard + 1) * num_rows // num_shards


def shard_meta_path(npy_path: str | Path) -> Path:
    return Path(npy_path).with_suffix(".json")


def read_passage_rows(passages_parquet: str | Path, start: int, stop: int, columns: Sequence[str] = ("title", "text")) -> pa.Table:
    """Rows [start, stop) of a parquet file, decoding only the row groups that overlap them."""
    pf = pq.ParquetFile(passages_parquet)
    parts = []
    offset = 0
    for rg in range(pf.metadata.num_row_groups):
        if offset >= stop:
            break
        n = pf.metadata.row_group(rg).num_rows
        lo, hi = max(start, offset), min(stop, offset + n)
        if lo < hi:
            parts.append(pf.read_row_group(rg, columns=list(columns)).slice(lo - offset, hi - lo))
        offset += n
    if not parts:
        return pf.schema_arrow.empty_table().select(list(columns))
    return pa.concat_tables(parts)


def write_embeddings(embeddings: np.ndarray, out_path: str | Path, meta: dict[str, Any]) -> None:
    """Write a float32 .npy shard and its sidecar; the sidecar goes last, so it marks completion."""
    arr = np.ascontiguousarray(embeddings, dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"embeddings must be 2-D, got shape {arr.shape}")
    with atomic_path(out_path) as tmp:
        # np.save(path) would append ".npy" to the temporary name; a file handle writes in place.
        with open(tmp, "wb") as f:
            np.save(f, arr, allow_pickle=False)
    write_json({**meta, "rows": int(arr.shape[0]), "dim": int(arr.shape[1])}, shard_meta_path(out_path))


def embed_shard(
    passages_parquet: str | Path,
    model: str | Encoder,
    shard: int,
    num_shards: int,
    out_path: str | Path,
    *,
    query_prefix: str = "",
    passage_prefix: str = "",
    batch_size: int = 64,
    max_length: int | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Encode rows [shard*n/num_shards, (shard+1)*n/num_shards) of the passages; return the sidecar.

    `model` is a model name/path (prefix arguments then apply) or a ready `Encoder`.
    """
    encoder = (
        model
        if isinstance(model, Encoder)
        else Encoder(
            model,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            batch_size=batch_size,
            max_length=max_length,
            device=device,
        )
    )
    num_rows = pq.ParquetFile(passages_parquet).metadata.num_rows
    start, stop = shard_range(num_rows, shard, num_shards)
    table = read_passage_rows(passages_parquet, start, stop)
    embeddings = encoder.encode_passages(passage_contents(table))
    meta = {
        **encoder.info(),
        "passages": str(passages_parquet),
        "num_passages": num_rows,
        "shard": shard,
        "num_shards": num_shards,
        "start": start,
        "stop": stop,
    }
    write_embeddings(embeddings, out_path, meta)
    return meta


# --------------------------------------------------------------------------- index build


@dataclass
class _Shard:
    path: Path
    array: np.ndarray  # memory-mapped, never read whole
    meta: dict[str, Any] | None


def _open_shards(shard_paths: Sequence[str | Path]) -> list[_Shard]:
    if not shard_paths:
        raise InputError("build_faiss_index needs at least one embedding shard")
    shards = []
    for p in map(Path, shard_paths):
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
        if arr.ndim != 2 or arr.dtype != np.float32:
            raise InputError(f"{p}: expected a 2-D float32 array, got {arr.dtype} with shape {arr.shape}")
        side = shard_meta_path(p)
        meta = _read_json(side) if side.exists() else None
        shards.append(_Shard(p, arr, meta))
    dims = {s.array.shape[1] for s in shards}
    if len(dims) != 1:
        raise InputError(f"embedding shards disagree on dimension: {sorted(dims)}")
    return shards


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _check_shard_layout(shards: list[_Shard]) -> dict[str, Any]:
    """Check shards tile the passages in order; return the encoding info they share (or {})."""
    metas = [s.meta for s in shards]
    if all(m is None for m in metas):
        return {}
    if any(m is None for m in metas):
        missing = [str(s.path) for s in shards if s.meta is None]
        raise InputError(f"some shards have no sidecar <shard>.json: {missing}")
    expected = 0
    for s in shards:
        m = s.meta
        if m["start"] != expected:
            raise InputError(f"{s.path}: starts at row {m['start']}, expected {expected}; are shards missing or out of order?")
        if m["stop"] - m["start"] != s.array.shape[0]:
            raise InputError(f"{s.path}: sidecar says {m['stop'] - m['start']} rows, file has {s.array.shape[0]}")
        expected = m["stop"]
    first = metas[0]
    for s in shards[1:]:
        diff = {k for k in (*_ENCODING_KEYS, "passages") if s.meta.get(k) != first.get(k)}
        if diff:
            raise InputError(f"{s.path}: encoded differently from {shards[0].path} (fields {sorted(diff)})")
    if expected != first["num_passages"]:
        raise InputError(f"shards cover {expected} rows but the passages file has {first['num_passages']}")
    return {k: first[k] for k in (*_ENCODING_KEYS, "passages", "num_passages") if k in first}


def _train_sample(shards: list[_Shard], size: int, seed: int) -> np.ndarray:
    """A uniform random sample of at most `size` rows across shards, read row by row from the mmaps."""
    total = sum(s.array.shape[0] for s in shards)
    size = min(size, total)
    rows = np.sort(np.random.default_rng(seed).choice(total, size=size, replace=False))
    out = np.empty((size, shards[0].array.shape[1]), dtype=np.float32)
    offset = filled = 0
    for s in shards:
        n = s.array.shape[0]
        local = rows[(rows >= offset) & (rows < offset + n)] - offset
        out[filled : filled + len(local)] = s.array[local]
        filled += len(local)
        offset += n
    return out


def _skip_polysemous_training(index: faiss.Index) -> bool:
    """Turn off the polysemous-code training that index_factory enables for "...,PQm" indexes.

    It only serves Hamming pre-filtering (polysemous_ht), which nothing here uses, and it dominates
    training time (seconds for 2k vectors, hours at Wikipedia scale). Returns whether it was on.
    """
    part = faiss.downcast_index(index)
    was_on = bool(getattr(part, "do_polysemous_training", False))
    if was_on:
        part.do_polysemous_training = False  # type: ignore[attr-defined]  # a swig attribute of PQ indexes
    # Wrappers: OPQ/PCA pre-transforms hold the PQ index in .index, HNSW-PQ in .storage.
    for attr in ("index", "storage"):
        inner = getattr(part, attr, None)
        if isinstance(inner, faiss.Index):
            was_on = _skip_polysemous_training(inner) or was_on
    return was_on


def _to_gpu(index: faiss.Index, devices: list[int]) -> tuple[faiss.Index, bool]:
    """The index on `devices`: sharded when there are several, so an index larger than one GPU's
    memory fits; vectors stay float32, so results equal the CPU's. Not every index type has a GPU
    version (HNSW does not); those stay on the CPU."""
    try:
        options = faiss.GpuMultipleClonerOptions()
        options.shard = len(devices) > 1
        return faiss.index_cpu_to_gpus_list(index, co=options, gpus=devices), True
    except (RuntimeError, AttributeError) as exc:
        print(f"[faiss] GPU unavailable for this index type, using CPU: {exc}", file=sys.stderr)
        return index, False


def _train(index: faiss.Index, sample: np.ndarray, use_gpu: bool) -> tuple[faiss.Index, bool]:
    """Train (k-means, PQ codebooks) on the GPU when there is one: that is where it pays off."""
    if use_gpu:
        # One GPU: k-means on a sample fits one device, and a sharded index would train per shard.
        gpu_index, on_gpu = _to_gpu(index, job_gpu_devices()[:1])
        if on_gpu:
            gpu_index.train(sample)
            return faiss.index_gpu_to_cpu(gpu_index), True
    index.train(sample)
    return index, False


def _chunks(shards: list[_Shard], chunk_rows: int) -> list[tuple[_Shard, int, int]]:
    return [(s, i, min(i + chunk_rows, s.array.shape[0])) for s in shards for i in range(0, s.array.shape[0], chunk_rows)]


def build_faiss_index(
    shard_paths: Sequence[str | Path],
    index_factory: str,
    out_dir: str | Path,
    metric: str = "ip",
    train_sample: int = 262_144,
    seed: int = 0,
    *,
    add_chunk: int = 65_536,
    use_gpu: bool | None = None,
    passages: str | Path | None = None,
    encoder_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build a FAISS index from embedding shards (in row order) into `out_dir`; return its meta.

    `index_factory` is a faiss factory string ("Flat", "HNSW32", "IVF256,Flat", "IVF256,PQ16").
    `passages` / `encoder_info` fill in the meta when shards have no sidecars (or override them).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    if add_chunk < 1 or train_sample < 1:
        raise InputError("add_chunk and train_sample must be >= 1")
    started = time.monotonic()
    shards = _open_shards(shard_paths)
    info = {**_check_shard_layout(shards), **(encoder_info or {})}
    if passages is not None:
        info["passages"] = str(passages)
    dim = shards[0].array.shape[1]
    try:
        index = faiss.index_factory(dim, index_factory, METRICS[metric])
    except RuntimeError as exc:
        raise InputError(f"FAISS index factory {index_factory!r} for {dim}-dimensional embeddings: "
                         f"{faiss_reason(str(exc))}") from None
    skipped_polysemous = _skip_polysemous_training(index)

    trained_on, gpu_train = 0, False
    if not index.is_trained:
        sample = _train_sample(shards, train_sample, seed)
        index, gpu_train = _train(index, sample, faiss_on_gpu(use_gpu))
        trained_on = len(sample)
        del sample
    # Adding stays on the CPU: the index grows in host RAM, where it has to end up anyway, and a
    # full-corpus Flat/IVF-Flat index can be larger than GPU memory.
    for shard, lo, hi in progress(_chunks(shards, add_chunk), desc=f"faiss add ({index_factory})", unit="chunk"):
        # A contiguous float32 slice of the memmap is passed without a copy; only its pages are read.
        index.add(np.ascontiguousarray(shard.array[lo:hi]))

    meta = {
        **info,
        "kind": "dense",
        "factory": index_factory,
        "metric": metric,
        "dim": int(dim),
        "ntotal": int(index.ntotal),
        "trained_on": trained_on,
        "polysemous_training_skipped": skipped_polysemous,
        "seed": seed,
        "gpu_train": gpu_train,
        "shards": [s.path.name for s in shards],
        "faiss_version": faiss.__version__,
        "build_seconds": round(time.monotonic() - started, 3),
        # Peak of the whole process so far (Linux reports KiB); in a one-rule job that is the build.
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if meta.get("passages"):
        meta["passages"] = relative_to_dir(meta["passages"], out_dir)
    with atomic_dir(out_dir) as tmp:
        faiss.write_index(index, str(tmp / INDEX_FILE))
        write_json(meta, tmp / META_FILE)
    return meta


# --------------------------------------------------------------------------- search


def set_search_params(index: faiss.Index, nprobe: int | None = None, ef_search: int | None = None) -> dict[str, int]:
    """Apply the search-time knobs that this index type has; return those that were applied."""
    wanted = {"nprobe": nprobe, "efSearch": ef_search}
    ivf = _ivf_or_none(index)
    if ivf is not None and nprobe is not None:
        wanted["nprobe"] = min(nprobe, ivf.nlist)  # more probes than lists is just slower
    space = faiss.GpuParameterSpace() if _is_gpu_index(index) else faiss.ParameterSpace()
    applied = {}
    for name, value in wanted.items():
        if value is None:
            continue
        try:
            space.set_index_parameter(index, name, int(value))
            applied[name] = int(value)
        except RuntimeError:
            pass  # e.g. nprobe on a Flat index: nothing to tune
    return applied


def _ivf_or_none(index: faiss.Index):
    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:
        return None


def _is_gpu_index(index: faiss.Index) -> bool:
    return "Gpu" in type(index).__name__


class DenseIndex:
    """A loaded FAISS index plus the meta that says how its vectors were made."""

    def __init__(self, index: faiss.Index, meta: dict[str, Any], search_params: dict[str, int], *,
                 on_gpu: bool = False) -> None:
        self.index = index
        self.meta = meta
        self.search_params = search_params
        self.on_gpu = on_gpu

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, row ids) per query row; ids are -1 where the index found fewer than k."""
        q = np.ascontiguousarray(vectors, dtype=np.float32)
        k = max(1, min(k, self.ntotal))
        return self.index.search(q, k)


def load_faiss_index(
    index_dir: str | Path,
    *,
    use_gpu: bool | None = False,
    nprobe: int | None = DEFAULT_NPROBE,
    ef_search: int | None = DEFAULT_EF_SEARCH,
) -> DenseIndex:
    index_dir = Path(index_dir)
    meta = _read_json(index_dir / META_FILE)
    if meta.get("kind") != "dense":
        raise InputError(f"{index_dir}: not a dense index (meta kind={meta.get('kind')!r})")
    index = faiss.read_index(str(index_dir / INDEX_FILE))
    on_gpu = False
    if faiss_on_gpu(use_gpu):
        index, on_gpu = _to_gpu(index, job_gpu_devices())
    applied = set_search_params(index, nprobe=nprobe, ef_search=ef_search)
    return DenseIndex(index, meta, applied, on_gpu=on_gpu)
