"""Issue 12, Finding 1 (docs/READING.md): how a world's test-split names tokenize under the old
tiny-policy tokenizer (trained on the world itself) and under the pretraining tokenizer (trained
on fresh-name text), and how many of their pieces never occur in the text SFT on the train split
can show (train questions, answers, their supporting passages).

    PYTHONPATH=src python scripts/exp_tokenizer_coverage.py --world results/world
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import pyarrow.parquet as pq


def main() -> None:
    from ragrl.toy.tiny_model import train_tokenizer, with_prompt_text
    from ragrl.toy.world import world_text
    from ragrl.train.pretrain import PretrainArgs, tokenizer_texts, world_names

    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=Path, required=True)
    ap.add_argument("--vocab-size", type=int, default=2000)
    w = ap.parse_args().world
    tokenizers = {
        "world tokenizer (tiny_model)": train_tokenizer(with_prompt_text(world_text(w)), 2000),
        "fresh-name tokenizer (pretrain)": train_tokenizer(tokenizer_texts(PretrainArgs(), world_names(w)), 2000),
    }
    test = [e["name"] for e in pq.read_table(w / "entities.parquet").to_pylist() if e["split"] == "test"]
    rows = pq.read_table(w / "qa/train.parquet").to_pylist()
    passages = {p["id"]: p for p in pq.read_table(w / "passages.parquet").to_pylist()}
    texts = [r["question"] + " " + r["golden_answers"][0] for r in rows]
    texts += [passages[i]["title"] + " " + passages[i]["text"] for r in rows for i in r["supporting_ids"]]
    for name, tok in tokenizers.items():
        seen = collections.Counter(t for x in texts for t in tok.encode(x, add_special_tokens=False))
        per_name = [tok.encode(" " + n, add_special_tokens=False) for n in test]
        pieces = [t for ids in per_name for t in ids]
        print(f"{name}: {len(pieces) / len(test):.2f} tokens per test name; "
              f"{sum(seen[t] == 0 for t in pieces)}/{len(pieces)} pieces absent from train-question text; "
              f"{sum(any(seen[t] == 0 for t in ids) for ids in per_name)}/{len(test)} names with such a piece; "
              f"e.g. {tok.tokenize(' ' + test[1])}")


if __name__ == "__main__":
    main()
