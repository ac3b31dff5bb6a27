"""How often a KG constructor checkpoint writes a valid triple array, by turn, on the toy world's
test episodes (each question's supporting passages, no negatives, one per turn).

    HF_HUB_OFFLINE=1 PYTHONPATH=src .venv/bin/python scripts/constructor_turn_validity.py \
        results/models/autograph_r1/sft_merged --questions 60 --temperature 0

Run from a directory holding a default run's `results/` (the world's passages and test split).
docs/AUTOGRAPH_R1.md quotes its figures for the one-document and the three-document SFT rows.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

import pyarrow.parquet as pq

from ragrl.eval.evaluate import load_policy
from ragrl.kg.constructor import ConstructorRollout, episodes_from_world


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--questions", type=int, default=60)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--passages", default="results/corpus/world/passages.parquet")
    p.add_argument("--qa", default="results/world/qa/test.parquet")
    args = p.parse_args(argv)
    generator, tokenizer = load_policy(args.model)
    passages = pq.read_table(args.passages).to_pylist()
    rows = pq.read_table(args.qa).to_pylist()[: args.questions]
    rollout = ConstructorRollout(generator, tokenizer, max_turn_tokens=256, max_response_tokens=1536,
                                 temperature=args.temperature)
    trajs = rollout.run(episodes_from_world(rows, passages, negatives=0), n=1, seed=0)
    by_turn: dict[int, list[bool]] = defaultdict(list)
    errors: Counter = Counter()
    for t in trajs:
        for k, turn in enumerate(t.turns):
            by_turn[k].append(turn.valid)
            if not turn.valid:
                errors[(turn.error or "")[:60]] += 1
    print(f"episodes valid end to end: {sum(t.complete for t in trajs)} / {len(trajs)}")
    for k, v in sorted(by_turn.items()):
        print(f"turn {k + 1}: {sum(v)} / {len(v)} valid")
    print(f"most common errors: {errors.most_common(8)}")


if __name__ == "__main__":
    main()
