"""Shared by the HARR tests: one OpenMP thread for torch and FAISS while they run, a toy policy.

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


class ToyPolicy(torch.nn.Module):
    """One learnable query vector per state: the update machinery without a transformer."""

    def __init__(self, states: list[str], dim: int, seed: int) -> None:
        super().__init__()
        self.ids = {s: i for i, s in enumerate(states)}
        self.table = torch.nn.Parameter(torch.randn(len(states), dim, generator=torch.Generator().manual_seed(seed)))

    def forward(self, texts):
        return torch.nn.functional.normalize(self.table[[self.ids[t] for t in texts]], dim=-1)

    @torch.no_grad()
    def encode(self, texts):
        return self.forward(texts)
