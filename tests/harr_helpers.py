"""Shared by the HARR tests: one OpenMP thread for torch and FAISS while they run.

Torch and FAISS each keep an OpenMP pool; alternating small calls between the two on a shared
2-core machine left each waiting for the other's spinning threads: the rollout tests took 317 s
with the default pools and 3 s with one thread each.
"""

from __future__ import annotations

import faiss
import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    torch_threads, faiss_threads = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    yield
    torch.set_num_threads(torch_threads)
    faiss.omp_set_num_threads(faiss_threads)
