"""Where retrieval runs when `retrieval.gpu` is on: FAISS on the job's GPUs, the query encoder on
CUDA; on a machine without them, on the CPU, said once per process.

Falling back instead of failing keeps one config valid on a laptop, a CPU CI box and a GPU node:
the results are the same (a Flat index is exact either way; IVF/HNSW search the same lists), only
the speed differs, and the note says which one ran.
"""

from __future__ import annotations

import os

from ragrl.progress import note_once


def faiss_gpu_count() -> int:
    """GPUs this faiss build can use: 0 for faiss-cpu (no get_num_gpus) or where none is visible."""
    import faiss

    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


def gpu_devices(num_gpus: int, local_rank: str | None) -> list[int]:
    """The GPUs a FAISS index goes to. A single-process job: all it was given (sharded across them).
    One rank of a multi-process job (accelerate/torchrun set LOCAL_RANK): its own GPU only, so N
    ranks do not each put a copy on all N GPUs."""
    if num_gpus < 1:
        return []
    if local_rank is not None and local_rank.strip():
        rank = int(local_rank)
        return [rank % num_gpus]
    return list(range(num_gpus))


def faiss_on_gpu(use_gpu: bool | None) -> bool:
    """Whether FAISS work goes to the GPUs. None: where faiss sees one (training only, the index
    build's default); True: the GPUs, or the CPU with a note when there are none; False: CPU."""
    have = faiss_gpu_count() > 0
    if use_gpu and not have:
        note_once("faiss", "[retrieval] retrieval.gpu is on, but this faiss build sees no GPU (faiss-cpu, or no "
                           "device in CUDA_VISIBLE_DEVICES): FAISS runs on the CPU, with the same results")
        return False
    return have if use_gpu is None else bool(use_gpu)


def job_gpu_devices() -> list[int]:
    return gpu_devices(faiss_gpu_count(), os.environ.get("LOCAL_RANK"))


def query_device(use_gpu: bool | None, device: str | None) -> str | None:
    """The query encoder's device: `device` when given; with retrieval.gpu on, CUDA (this rank's
    current device) or the CPU with a note; otherwise None, i.e. the encoder's own default."""
    if device or not use_gpu:
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    note_once("encoder", "[retrieval] retrieval.gpu is on, but torch sees no CUDA device: the query encoder runs "
                         "on the CPU")
    return "cpu"
