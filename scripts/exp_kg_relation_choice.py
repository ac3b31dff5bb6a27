"""Issue 12, KG-R1 (docs/READING.md, "KG-R1: the question restated"): how a KG agent's episodes
on KG A go wrong, and whether it follows the relation the question asks for.

    PYTHONPATH=src python scripts/exp_kg_relation_choice.py --run-dir <a make-run directory> [--run kg_r1_rl]

Reads `results/eval/<run>/world_kgqa_A_test/predictions.parquet`, KG A and its test split, and
prints: the wrong answers by kind; on the questions whose gold path (`plan_row`, the SFT
planner's) is one hop, how often the first relation followed is the gold one, per gold relation;
and how many relation-choosing thoughts open with the question word for word. With
`--sft-data`, also the mean tokens a restated question adds to a relation-choosing thought.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

_THOUGHT = re.compile(r"<think>(.*?)</think>", re.S)
_INFO = re.compile(r"<information>(.*?)</information>", re.S)
_FOLLOWED = re.compile(r'get_entities_out\("[^"]*",\s*"([^"]*)"\)')
_CHOICE = " has the relation "


def wrong_kind(row: dict) -> str:
    infos = _INFO.findall(row["response"])
    if any("Entity not found" in i for i in infos):
        return "entity not found"
    if row["stop_reason"] != "answer":
        return "no answer"
    if any("not found" in i for i in infos):
        return "answered after a relation not found"
    return "well-formed, wrong answer"


def main() -> None:
    import polars as pl

    from ragrl.data.qa import load_qa
    from ragrl.kg.store import load_kg
    from ragrl.train.kg_sft_data import plan_row

    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--run", default="kg_r1_rl")
    ap.add_argument("--sft-data", type=Path,
                    help="an SFT parquet of restated trajectories (results/sft_data/kg_r1.parquet)")
    args = ap.parse_args()
    d = args.run_dir
    preds = pl.read_parquet(d / f"results/eval/{args.run}/world_kgqa_A_test/predictions.parquet").to_dicts()
    store = load_kg(d / "results/world/kg/A").store
    qa = load_qa("kgqa", d / "results/world/kgqa/A/test.parquet").to_pylist()
    plans = {r["id"]: plan_row(r, store) for r in qa}

    wrong = collections.Counter(wrong_kind(r) for r in preds if not r["em"])
    print(f"{args.run}: {sum(r['em'] for r in preds):.0f} right of {len(preds)}; wrong: {dict(wrong)}")

    gold = {i: p.path[0][1] for i, p in plans.items() if not isinstance(p, str) and len(p.path) == 1}
    firsts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in preds:
        if r["id"] in gold:
            followed = [m.strip() for m in _FOLLOWED.findall(" ".join(r["queries"]))]
            firsts[gold[r["id"]]][followed[0] if followed else "(none)"] += 1
    right = sum(c[rel] for rel, c in firsts.items())
    print(f"one-hop questions (gold path): first relation followed is the gold one in {right} of "
          f"{sum(sum(c.values()) for c in firsts.values())}")
    for rel, c in sorted(firsts.items(), key=lambda item: -sum(item[1].values())):
        print(f"  {rel}: {c[rel]} of {sum(c.values())}; followed: {dict(c.most_common())}")

    choosing = [(t, r["question"]) for r in preds for t in _THOUGHT.findall(r["response"]) if _CHOICE in t]
    verbatim = sum(t.startswith(q + " ") for t, q in choosing)
    print(f"relation-choosing thoughts: {len(choosing)}, opening with the question word for word: {verbatim}")

    if args.sft_data:
        import transformers

        tok = transformers.AutoTokenizer.from_pretrained(d / "results/models/pretrained")
        rows = pl.read_parquet(args.sft_data).to_dicts()
        # The thought's tokens with and without the question (and the space after it).
        added = [len(tok.encode(t, add_special_tokens=False))
                 - len(tok.encode(t[len(q) + 1:], add_special_tokens=False))
                 for r in rows for q in [re.search(r"Question: (.*)\n", r["text"]).group(1)]
                 for t in _THOUGHT.findall(r["text"]) if _CHOICE in t and t.startswith(q + " ")]
        print(f"SFT data: {len(added)} restated thoughts, {sum(added) / max(1, len(added)):.2f} tokens added each")


if __name__ == "__main__":
    main()
