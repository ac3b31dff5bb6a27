"""retrieval.gpu on a machine without a GPU: said once, run on the CPU, the same results.

What a GPU run adds (the index on the GPUs, sharded across several; the encoder on CUDA) is in
scripts/gpu_check.sh (docs/GPU.md); here the fallback path and the device choice are checked.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from ragrl import progress
from ragrl.retrieval import gpu
from ragrl.retrieval.dense import build_faiss_index, load_faiss_index, write_embeddings
from ragrl.retrieval.searcher import load_searcher
from helpers import MODEL, clustered_unit_vectors, passages_path  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(gpu.faiss_gpu_count() > 0, reason="a GPU is present: the fallback is not taken")


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch):
    monkeypatch.setattr(progress, "_NOTED", set())


@pytest.mark.parametrize("num_gpus,local_rank,expected", [
    (0, None, []), (1, None, [0]), (4, None, [0, 1, 2, 3]), (4, "2", [2]), (2, "3", [1]), (8, "", list(range(8))),
])
def test_gpu_devices(num_gpus, local_rank, expected):
    assert gpu.gpu_devices(num_gpus, local_rank) == expected


def test_query_device():
    assert gpu.query_device(False, None) is None  # the encoder's own default, as before
    assert gpu.query_device(True, "cpu") == "cpu"  # an explicit device wins
    assert gpu.query_device(True, None) == "cpu"  # no CUDA here


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_fallback")
    x = clustered_unit_vectors(3000, 32, seed=3)
    paths = []
    for i, (lo, hi) in enumerate([(0, 1500), (1500, 3000)]):
        paths.append(root / f"emb_{i}.npy")
        write_embeddings(x[lo:hi], paths[-1], {"start": lo, "stop": hi, "num_passages": 3000, "model": "m",
                                              "query_prefix": "", "passage_prefix": "", "normalize": True,
                                              "max_length": 8, "passages": "p", "shard": i, "num_shards": 2})
    return root, paths, clustered_unit_vectors(50, 32, seed=4)


@pytest.mark.parametrize("factory", ["Flat", "IVF16,Flat"])
def test_index_build_and_search_fall_back_to_cpu_with_identical_results(shards, factory, capfd):
    root, paths, queries = shards
    cpu_meta = build_faiss_index(paths, factory, root / f"cpu_{factory}", use_gpu=False)
    gpu_meta = build_faiss_index(paths, factory, root / f"gpu_{factory}", use_gpu=True)
    assert gpu_meta["gpu_train"] is False and gpu_meta["ntotal"] == cpu_meta["ntotal"] == 3000
    cpu = load_faiss_index(root / f"cpu_{factory}", use_gpu=False)
    on_gpu = [load_faiss_index(root / f"gpu_{factory}", use_gpu=True) for _ in range(2)]
    assert not any(i.on_gpu for i in on_gpu)
    scores, ids = cpu.search(queries, 10)
    for index in on_gpu:
        s, i = index.search(queries, 10)
        np.testing.assert_array_equal(i, ids)
        np.testing.assert_array_equal(s, scores)
    err = capfd.readouterr().err
    assert err.count("retrieval.gpu is on, but this faiss build sees no GPU") == 1, err


@pytest.mark.slow
def test_searcher_with_gpu_setting_gives_the_cpu_hits(tmp_path, passages_path, capfd):  # noqa: F811
    from ragrl.retrieval.dense import embed_shard
    from ragrl.retrieval.encoder import Encoder

    encoder = Encoder(MODEL, query_prefix="query: ", passage_prefix="passage: ", batch_size=4, device="cpu")
    shard = tmp_path / "emb_0.npy"
    embed_shard(passages_path, encoder, 0, 1, shard)
    build_faiss_index([shard], "Flat", tmp_path / "index", use_gpu=True)
    queries = ["who discovered penicillin", "highest mountain", "zorblax island", "moon landing year"]
    cpu = load_searcher(tmp_path / "index", use_gpu=False)
    fallback = load_searcher(tmp_path / "index", use_gpu=True)
    assert fallback.dense.encoder.device == "cpu"
    assert [[(h.id, h.score) for h in hits] for hits in fallback.search(queries, 3)] == \
        [[(h.id, h.score) for h in hits] for hits in cpu.search(queries, 3)]
    err = capfd.readouterr().err
    assert err.count("faiss build sees no GPU") == 1 and err.count("the query encoder runs on the CPU") == 1, err
