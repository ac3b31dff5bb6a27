"""Index building and in-process search: sharded embedding, FAISS, BM25, hybrid fusion."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrl.retrieval.dense import (
    build_faiss_index,
    embed_shard,
    load_faiss_index,
    read_passage_rows,
    shard_meta_path,
    shard_range,
    write_embeddings,
)
from ragrl.retrieval.encoder import Encoder, passage_contents
from ragrl.retrieval.searcher import DenseRetriever, PassageStore, Searcher, load_searcher, rrf
from ragrl.retrieval.sparse import build_bm25, load_bm25

from helpers import (  # noqa: F401  (passages_path: a fixture)
    MODEL,
    PASSAGES,
    clustered_unit_vectors,
    passages_path,
    passages_table,
)


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder(MODEL, query_prefix="query: ", passage_prefix="passage: ", batch_size=4)


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory, passages_path, encoder) -> Path:
    root = tmp_path_factory.mktemp("dense")
    shards = [root / f"emb_{s}.npy" for s in range(2)]
    for s, out in enumerate(shards):
        embed_shard(passages_path, encoder, s, 2, out)
    build_faiss_index(shards, "Flat", root / "index")
    return root / "index"


@pytest.fixture(scope="module")
def bm25_dir(tmp_path_factory, passages_path) -> Path:
    out = tmp_path_factory.mktemp("bm25") / "bm25"
    build_bm25(passages_path, out)
    return out


# ----------------------------------------------------------------------------- random vectors


def write_plain_shards(x: np.ndarray, directory: Path, num_shards: int) -> list[Path]:
    paths = []
    for s in range(num_shards):
        lo, hi = shard_range(len(x), s, num_shards)
        paths.append(directory / f"shard_{s}.npy")
        np.save(paths[-1], x[lo:hi])
    return paths


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    x = clustered_unit_vectors(2000, 32, seed=0)
    rng = np.random.default_rng(1)
    q = x[rng.choice(len(x), 100, replace=False)] + 0.1 * rng.standard_normal((100, 32)).astype(np.float32)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    shards = write_plain_shards(x, tmp_path_factory.mktemp("shards"), 3)
    return x, q, shards


def brute_force(x: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    sims = q @ x.T
    ids = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, ids, axis=1), ids


@given(n=st.integers(0, 10_000), num_shards=st.integers(1, 64))
@settings(max_examples=200, deadline=None)
def test_shard_ranges_tile_the_rows(n, num_shards):
    ranges = [shard_range(n, s, num_shards) for s in range(num_shards)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_flat_index_equals_brute_force(vectors, tmp_path):
    x, q, shards = vectors
    meta = build_faiss_index(shards, "Flat", tmp_path / "flat")
    assert meta["ntotal"] == len(x) and meta["dim"] == 32 and meta["trained_on"] == 0
    scores, ids = load_faiss_index(tmp_path / "flat").search(q, 10)
    want_scores, want_ids = brute_force(x, q, 10)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("factory", "params", "min_recall"),
    [
        ("HNSW32", {"ef_search": 32}, 0.95),
        ("IVF64,Flat", {"nprobe": 4}, 0.9),
        ("IVF16,PQ16", {"nprobe": 4}, 0.8),
    ],
)
def test_approximate_index_recall(vectors, tmp_path, factory, params, min_recall):
    x, q, shards = vectors
    meta = build_faiss_index(shards, factory, tmp_path / "ix", train_sample=1500, seed=3)
    assert meta["ntotal"] == len(x)
    if factory != "HNSW32":
        assert meta["trained_on"] == 1500  # bounded sample, not the whole corpus
    index = load_faiss_index(tmp_path / "ix", **params)
    assert index.search_params == {("nprobe" if "nprobe" in params else "efSearch"): next(iter(params.values()))}
    _, ids = index.search(q, 10)
    _, want = brute_force(x, q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, want)])
    assert recall >= min_recall, f"{factory}: recall@10 {recall:.3f}"


def test_build_streams_shards_instead_of_loading_them(tmp_path):
    x = clustered_unit_vectors(60_000, 64, seed=2)
    shards = write_plain_shards(x, tmp_path, 3)
    shard_bytes = x.nbytes // 3
    del x
    tracemalloc.start()
    try:
        # Guard against a vacuous pass: numpy buffers must be visible to tracemalloc here.
        probe = np.ones(shard_bytes // 4, dtype=np.float32)
        assert tracemalloc.get_traced_memory()[1] >= shard_bytes
        del probe
        tracemalloc.reset_peak()
        meta = build_faiss_index(shards, "IVF16,Flat", tmp_path / "ix", train_sample=1024, add_chunk=2000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert meta["ntotal"] == 60_000
    # Loading (or concatenating) even one shard would allocate shard_bytes (5 MB).
    assert peak < shard_bytes / 4, f"build allocated {peak / 1e6:.1f} MB of arrays; shards are {shard_bytes / 1e6:.1f} MB"


def test_build_checks_shard_sidecars(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # sidecars name the passages as the embed job saw them
    x = clustered_unit_vectors(30, 8, seed=4)
    info = {"model": "m", "query_prefix": "q: ", "passage_prefix": "p: ", "normalize": True, "max_length": 32}
    paths = []
    for s in range(3):
        lo, hi = shard_range(30, s, 3)
        paths.append(tmp_path / f"emb_{s}.npy")
        meta = {**info, "passages": "corpus.parquet", "num_passages": 30, "shard": s, "num_shards": 3, "start": lo, "stop": hi}
        write_embeddings(x[lo:hi], paths[-1], meta)
    assert json.loads(shard_meta_path(paths[1]).read_text())["start"] == 10

    with pytest.raises(ValueError, match="out of order"):
        build_faiss_index([paths[1], paths[0], paths[2]], "Flat", tmp_path / "bad")
    with pytest.raises(ValueError, match="missing or out of order"):
        build_faiss_index([paths[0], paths[2]], "Flat", tmp_path / "bad")
    with pytest.raises(ValueError, match="cover 20 rows"):
        build_faiss_index(paths[:2], "Flat", tmp_path / "bad")
    other = json.loads(shard_meta_path(paths[2]).read_text())
    shard_meta_path(paths[2]).write_text(json.dumps({**other, "query_prefix": ""}))
    with pytest.raises(ValueError, match="query_prefix"):
        build_faiss_index(paths, "Flat", tmp_path / "bad")
    shard_meta_path(paths[2]).write_text(json.dumps(other))
    assert not (tmp_path / "bad").exists()

    meta = build_faiss_index(paths, "Flat", tmp_path / "good")
    saved = json.loads((tmp_path / "good" / "meta.json").read_text())
    assert saved == meta
    assert (meta["model"], meta["query_prefix"], meta["passage_prefix"], meta["passages"]) == ("m", "q: ", "p: ", "../corpus.parquet")
    assert meta["peak_rss_mb"] > 0
    assert sorted(os.listdir(tmp_path / "good")) == ["index.faiss", "meta.json"]


# ----------------------------------------------------------------------------- real passages


def test_read_passage_rows_reads_only_overlapping_row_groups(passages_path, monkeypatch):
    read = []
    original = pq.ParquetFile.read_row_group

    def spy(self, i, *args, **kwargs):
        read.append(i)
        return original(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    table = read_passage_rows(passages_path, 5, 9)  # row groups of 4: rows 5-8 live in groups 1, 2
    assert table["title"].to_pylist() == [t for t, _ in PASSAGES[5:9]]
    assert read == [1, 2]


@pytest.mark.slow
def test_sharded_embedding_equals_encoding_all_at_once(passages_path, encoder, tmp_path):
    parts = []
    for s in range(3):
        out = tmp_path / f"emb_{s}.npy"
        meta = embed_shard(passages_path, encoder, s, 3, out)
        emb = np.load(out, allow_pickle=False)
        assert emb.dtype == np.float32 and emb.shape == (meta["stop"] - meta["start"], encoder.dim)
        assert (meta["start"], meta["stop"]) == shard_range(len(PASSAGES), s, 3)
        assert meta["query_prefix"] == "query: " and meta["passage_prefix"] == "passage: "
        parts.append(emb)
    full = encoder.encode_passages(passage_contents(passages_table()))
    np.testing.assert_allclose(np.concatenate(parts), full, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(full, axis=1), 1.0, atol=1e-5)
    # Prefixes are applied: without them the vectors differ.
    plain = encoder._encode(passage_contents(passages_table()), "x", False)
    assert not np.allclose(plain, full, atol=1e-3)


def test_bm25_finds_rare_term_and_saves_without_pickle(bm25_dir, passages_path):
    files = sorted(os.listdir(bm25_dir))
    assert files and all(f.endswith((".npy", ".json")) for f in files), files
    for f in files:
        if f.endswith(".npy"):
            np.load(bm25_dir / f, allow_pickle=False)
    index = load_bm25(bm25_dir)
    scores, rows = index.search(["zorblax", "who discovered penicillin antibiotic", "the of and"], 3)
    assert rows[0, 0] == 7 and scores[0, 0] > 0 and scores[0, 1] == 0
    assert rows[1, 0] == 5
    # Only stopwords: nothing matches; still k rows, ties broken by row order.
    assert rows[2].tolist() == [0, 1, 2] and not scores[2].any()
    assert index.search(["zorblax"], 1000)[1].shape == (1, len(PASSAGES))


def test_rrf_fuses_ranks_not_scores():
    dense = [[(1, 0.9), (2, 0.8), (3, 0.1)]]
    bm25 = [[(3, 40.0), (1, 2.0), (4, 1.0)]]
    fused = rrf([dense, bm25], topk=4, k=60)[0]
    expected = {1: 1 / 61 + 1 / 62, 3: 1 / 63 + 1 / 61, 2: 1 / 62, 4: 1 / 63}
    assert [r for r, _ in fused] == [1, 3, 2, 4]
    for row, score in fused:
        assert score == pytest.approx(expected[row])


def test_dense_searcher_matches_brute_force(dense_dir, passages_path, encoder):
    searcher = Searcher(PassageStore.from_parquet(passages_path), DenseRetriever(encoder, load_faiss_index(dense_dir)))
    queries = ["Who discovered penicillin?", "What is the highest mountain?", "Where is the Eiffel Tower?"]
    hits = searcher.search(queries, 3)
    emb = encoder.encode_passages(passage_contents(passages_table()))
    want_scores, want_ids = brute_force(emb, encoder.encode_queries(queries), 3)
    assert [[h.id for h in per_q] for per_q in hits] == [[f"p{i}" for i in row] for row in want_ids]
    np.testing.assert_allclose([[h.score for h in per_q] for per_q in hits], want_scores, atol=1e-5)
    assert [per_q[0].title for per_q in hits] == ["Penicillin", "Mount Everest", "Eiffel Tower"]
    assert hits[0][0].contents == f"Penicillin\n{PASSAGES[5][1]}"


def test_hybrid_searcher(dense_dir, bm25_dir):
    searcher = load_searcher(dense_dir, bm25_dir)
    assert searcher.mode == "hybrid"
    queries = ["zorblax", "marsupial animals of Australia zorblax", "Who discovered penicillin?", "baked bread"]
    hybrid = searcher.search(queries, 5)

    def ranked(mode, k):
        other = load_searcher(dense_dir, bm25_dir, mode)
        return [[(int(h.id[1:]), h.score) for h in per_q] for per_q in other.search(queries, k)]

    depth = searcher.fusion_depth
    dense, bm25 = ranked("dense", depth), ranked("bm25", depth)
    assert not any(s for _, s in bm25[3])  # no query term occurs in any passage
    want = rrf([dense, [[(r, s) for r, s in per_q if s > 0] for per_q in bm25]], topk=5)
    assert [[(int(h.id[1:]), h.score) for h in per_q] for per_q in hybrid] == [
        [(r, pytest.approx(s)) for r, s in per_q] for per_q in want
    ]
    # The rare term only BM25 can match still surfaces; the semantic neighbour does too.
    assert {h.title for h in hybrid[1][:3]} >= {"Quokka", "Kangaroo"}
    assert hybrid[2][0].title == "Penicillin"
    # Zero-score BM25 padding does not vote: with no lexical match the dense order stands.
    assert [h.id for h in hybrid[3]] == [f"p{r}" for r, _ in dense[3][:5]]
    # A top-2 is a prefix of a top-5 (the service relies on this to batch mixed topk values).
    assert searcher.search(queries, 2) == [per_q[:2] for per_q in hybrid]


def test_searcher_rejects_index_for_other_passages(dense_dir, encoder):
    fewer = PassageStore(passages_table(PASSAGES[:5]))
    with pytest.raises(ValueError, match="rows but the passages have 5"):
        Searcher(fewer, DenseRetriever(encoder, load_faiss_index(dense_dir)))
    other = Encoder(MODEL, batch_size=4)  # same model, no prefixes: would encode queries wrongly
    with pytest.raises(ValueError, match="query_prefix"):
        DenseRetriever(other, load_faiss_index(dense_dir))


def test_index_finds_its_passages_from_another_directory(tmp_path, monkeypatch):
    # Issue 18 F9: the index recorded the passages path relative to where it was built.
    work = tmp_path / "work"
    (work / "corpus").mkdir(parents=True)
    pq.write_table(passages_table(), work / "corpus/passages.parquet")
    monkeypatch.chdir(work)
    build_bm25(Path("corpus/passages.parquet"), Path("index/bm25"))
    assert json.loads(Path("index/bm25/meta.json").read_text())["passages"] == "../../corpus/passages.parquet"
    monkeypatch.chdir(tmp_path)
    assert load_searcher(work / "index/bm25").search(["zorblax"], 1)[0][0].title == "Quokka"
    # Passages moved elsewhere: the error says how to point at them, and --passages does.
    moved = tmp_path / "moved.parquet"
    os.replace(work / "corpus/passages.parquet", moved)
    with pytest.raises(FileNotFoundError, match="--passages"):
        load_searcher(work / "index/bm25")
    assert load_searcher(work / "index/bm25", passages=moved).search(["zorblax"], 1)[0][0].title == "Quokka"


def test_serve_retriever_takes_passages_flag(tmp_path, monkeypatch):
    import ragrl.retrieval.service as service
    from ragrl.cli import main

    seen = {}
    monkeypatch.setattr(service, "serve", lambda *a, **kw: seen.update(kw))
    assert main(["serve-retriever", "--bm25", str(tmp_path / "bm25"), "--passages", str(tmp_path / "p.parquet")]) == 0
    assert seen["passages"] == tmp_path / "p.parquet"


def test_qa_without_question_names_file_and_column(tmp_path, bm25_dir):
    from ragrl.errors import DataFormatError
    from ragrl.retrieval.evaluate import evaluate_retrieval

    qa = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"query": ["zorblax"], "supporting_ids": [["p7"]]}), qa)
    with pytest.raises(DataFormatError, match=r"qa\.parquet: missing column\(s\) \['question'\]"):
        evaluate_retrieval(load_searcher(bm25_dir), qa, [1])


def test_factory_typo_is_named_without_data(vectors, tmp_path):
    from ragrl.retrieval.factory import factory_error

    assert factory_error("IVF4096,PQ64") is None and factory_error("HNSW32") is None
    assert "could not parse index string Flatt,Foo" in factory_error("Flatt,Foo")
    _, _, shards = vectors
    with pytest.raises(ValueError, match="FAISS index factory 'Flatt,Foo' for 32-dimensional embeddings: could not parse"):
        build_faiss_index(shards, "Flatt,Foo", tmp_path / "bad")
