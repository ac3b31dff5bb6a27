"""What AutoGraph-R1's R_I pays for on the toy: episode recall@k of hand-made graphs (issue #36 review).

    .venv/bin/python scripts/autograph_probe_graphs.py --results RUN/results [--negatives 2] \
        [--top-triples 10 5 3 1] [--k 2 5]

RUN is a finished default run (a `make run` work tree). Episodes are the DAG's evaluation episodes
(`episodes_from_world` over world_test, hard negatives from the dense retriever, the recipe's
default of 2), and each graph is scored by the reward's own ranking (`episode_ranking`: the
question's top triples seed Personalized PageRank over the episode's graph) as R_I scores a
constructor's. The graphs are made by hand, one per document:

- gold: the world's true triples of the passage (KG A);
- title_only: one triple (title, "is", title);
- copy_text: one triple (title, "states", the passage's first 500 characters);
- star_hub: (HUB, "mentions", e) for every entity of the passage's true triples;

and, for reference, the episode's documents in a random order (seeded). A reward under which a
degenerate graph beats the gold one cannot tell a good constructor from a bad one.
"""

from __future__ import annotations

import argparse
import collections
import random
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, required=True, help="a finished run's results/ directory")
    p.add_argument("--negatives", type=int, default=2)
    p.add_argument("--top-triples", type=int, nargs="+", default=[10])
    p.add_argument("--k", type=int, nargs="+", default=[2, 5])
    args = p.parse_args()

    import numpy as np
    import pyarrow.parquet as pq

    from ragrl.kg.constructor import episode_ranking, episodes_from_world
    from ragrl.kg.extraction import ParsedTurn, Triple
    from ragrl.kg.graph_scoring import recall_at_k
    from ragrl.retrieval.encoder import Encoder

    embed = Encoder("sentence-transformers/all-MiniLM-L6-v2", device="cpu").encode_queries
    world = args.results / "world"
    passages = pq.read_table(world / "passages.parquet").to_pylist()
    questions = pq.read_table(world / "qa/test.parquet").to_pylist()
    gold: dict[str, list[Triple]] = collections.defaultdict(list)
    for t in pq.read_table(world / "kg/A/triples.parquet").to_pylist():
        gold[str(t["source_id"])].append(Triple(t["head"], t["relation"], t["tail"]))
    vectors = embed([f"{d['title']}\n{d['text']}" for d in passages])

    def search(queries: list[str], k: int) -> list[list[dict]]:
        return [[passages[i] for i in np.argsort(-(vectors @ q))[:k]] for q in embed(queries)]

    episodes = episodes_from_world(questions, passages, negatives=args.negatives, search=search)
    sizes = collections.Counter(len(e.documents) for e in episodes)
    print(f"{len(episodes)} episodes; documents per episode: {dict(sorted(sizes.items()))}")

    def graphs(doc) -> dict[str, list[Triple]]:
        true = gold.get(doc.id, [])
        entities = list(dict.fromkeys(x for t in true for x in (t.subject, t.object)))
        return {"gold": true or [Triple(doc.title, "is", doc.title)],
                "title_only": [Triple(doc.title, "is", doc.title)],
                "copy_text": [Triple(doc.title, "states", doc.text[:500])],
                "star_hub": [Triple("HUB", "mentions", e) for e in entities] or [Triple("HUB", "mentions", doc.title)]}

    rng = random.Random(0)
    shuffled = []
    for e in episodes:
        ids = [d.id for d in e.documents]
        rng.shuffle(ids)
        shuffled.append(ids)
    print("| top_triples | graph | " + " | ".join(f"recall@{k}" for k in args.k) + " |")
    print("|---:|---|" + "---:|" * len(args.k))
    for top in args.top_triples:
        recall: dict[str, dict[int, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
        for e, ids in zip(episodes, shuffled):
            for name in graphs(e.documents[0]):
                turns = [ParsedTurn(True, tuple(graphs(d)[name])) for d in e.documents]
                ranking = episode_ranking(e, turns, embed, top_triples=top)
                for k in args.k:
                    recall[name][k].append(recall_at_k(ranking.passage_ids, e.supporting_ids, k))
            for k in args.k:
                recall["documents in random order"][k].append(recall_at_k(ids, e.supporting_ids, k))
        for name, by_k in recall.items():
            print(f"| {top} | {name} | " + " | ".join(f"{np.mean(by_k[k]):.3f}" for k in args.k) + " |")


if __name__ == "__main__":
    main()
