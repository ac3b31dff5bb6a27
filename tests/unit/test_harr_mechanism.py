"""The mechanism HARR's default training relies on (docs/HARR.md, "Training on the questions where
history matters"), on the real MiniLM encoder with the default's LoRA and update settings."""

from __future__ import annotations

import random
from pathlib import Path

import faiss
import pytest
import torch
import yaml

from ragrl.recipe import parse_harr
from ragrl.retrieval.query_state import history_state
from ragrl.toy.names import NameFactory
from ragrl.train.retriever_grpo import Trajectory, update
from ragrl.train.retriever_policy import retrieve

from harr_helpers import one_thread  # noqa: F401  (autouse: one OpenMP thread)

REPO = Path(__file__).resolve().parents[2]
# The default's training and encoder settings: the mechanism is checked where the default runs it.
DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())["harr"]
POOL, K = 10, DEFAULT["environment"]["topk"]
ALPHA, GROUP = DEFAULT["train"]["alpha"], DEFAULT["train"]["group_size"]


def _chains(n: int) -> list[tuple[str, str, str]]:
    names = NameFactory(random.Random(0))
    out = []
    for _ in range(n):
        book, person, country, company = names.book(), names.person(), names.country(), names.company()
        first = f"{book} appeared in print in 1970. Readers remember {book} for its maps. The book was written by {person}."
        second = f"{person} was born in the year 1945. {person} works for {company}. {person} is a citizen of {country}."
        # The second search's history-aware state: the question and the first sub-query both name
        # the book (the first hop's passage), the query alone names the person (the second's).
        state = history_state(
            f"Which country is the author of {book} a citizen of?",
            [{"sub_query": f"Who wrote {book}?", "answer": f"I need to find out: Who wrote {book}? Then: What is the "
                                                           "nationality of #1?"}],
            f"What is the nationality of {person}?")
        out.append((state, first, second))
    return out


@pytest.mark.slow
def test_grpo_on_second_hop_states_learns_to_rank_the_second_hops_passage_first_on_held_out_questions():
    """On history-aware second-hop states the frozen MiniLM ranks the first hop's passage above
    the second's (on the toy's bridge test questions the second comes first on 2 of 24); paid when
    the second hop's passage comes first, a few GRPO updates at the default's settings (LoRA, lr,
    alpha and G of config/config.yaml) rank it first on held-out questions of the same form. Fails
    if the update stops moving the ranking the reward asks for."""
    from ragrl.retrieval.encoder import Encoder
    from ragrl.stages.harr import _policy

    chains = _chains(24)
    encoder = Encoder("sentence-transformers/all-MiniLM-L6-v2", batch_size=16)
    docs = encoder.encode_passages([p for _, first, second in chains for p in (first, second)], show_progress=False)
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(docs)
    harr = parse_harr({"generator": "g", "index": "flat", "train_dataset": "t", "eval_datasets": ["t"],
                       "encoder": DEFAULT["encoder"], "train": DEFAULT["train"]})
    policy = _policy({"encoder": encoder.info()}, harr, None, trainable=True)
    train, held_out = list(range(16)), list(range(16, 24))

    def second_first(ids: list[int]) -> int:
        steps = retrieve(policy, index, [chains[i][0] for i in ids], pool_size=POOL, k=K, alpha=ALPHA, stochastic=False)
        return sum(s.doc_ids[0] == 2 * i + 1 for s, i in zip(steps, ids))

    before = second_first(held_out)
    assert before <= 3, f"the frozen encoder already ranks the second hop first on {before} of 8: no probe"
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=harr.train.lr)
    generator = torch.Generator().manual_seed(0)
    for step in range(5):
        batch = random.Random(step).sample(train, 8)
        trajectories = [Trajectory(str(i), g, float(s.doc_ids[0] == 2 * i + 1), [s]) for g, i in enumerate(batch)
                        for s in retrieve(policy, index, [chains[i][0]] * GROUP, pool_size=POOL, k=K, alpha=ALPHA,
                                          generator=generator)]
        update(policy, index, optimizer, trajectories, alpha=ALPHA)
    after = second_first(held_out)
    assert after >= 7 and after >= before + 4, (before, after)
