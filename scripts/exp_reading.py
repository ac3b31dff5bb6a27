"""Experiments for issue 12: does a pretrained tiny policy read? (docs/READING.md has the results.)

Pretrains the tiny policy (`ragrl.train.pretrain`) with the given settings against an evaluation
world and prints the reading-probe curve (greedy EM on held-out questions given their passages).

    PYTHONPATH=src python scripts/exp_reading.py --world /tmp/rd/world --steps 1500 --out /tmp/rd/run1

Also reports how the evaluation world's test names tokenize and how often their pieces occur
in the pretraining stream (a piece never seen in training has an untrained embedding).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import fields
from pathlib import Path

import pyarrow.parquet as pq


def main() -> None:
    from ragrl.toy.tiny_model import TinyModelSpec
    from ragrl.train.pretrain import PretrainArgs, pretrain

    ap = argparse.ArgumentParser()
    ap.add_argument("--world", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--probe-split", default="test")
    for f in fields(PretrainArgs):
        ap.add_argument("--" + f.name.replace("_", "-"), type=_type(f), default=None)
    for f in fields(TinyModelSpec):
        ap.add_argument("--model-" + f.name.replace("_", "-"), type=int, default=None)
    a = ap.parse_args()
    args = PretrainArgs(**{f.name: getattr(a, f.name) for f in fields(PretrainArgs)
                           if getattr(a, f.name) is not None})
    spec = TinyModelSpec(**{f.name: getattr(a, "model_" + f.name) for f in fields(TinyModelSpec)
                            if getattr(a, "model_" + f.name) is not None})
    print(json.dumps({"args": vars(a)}), flush=True)
    out = pretrain(a.world, a.out, spec, args, probe_split=a.probe_split)
    coverage(a.world, out, args)
    log = [json.loads(x) for x in (Path(out) / "pretrain_log.jsonl").read_text().splitlines()]
    for r in log:
        if "probe_em" in r:
            print(json.dumps({k: r[k] for k in ("step", "loss", "elapsed_s", "probe_em", "probe_em_by_type")}))


def coverage(world: str, model_dir: Path, args) -> None:
    """How the world's test-split names tokenize, and how often each piece occurs in 200 pretraining examples."""
    import transformers

    from ragrl.train.pretrain import corpus_examples, world_names

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ents = pq.read_table(Path(world) / "entities.parquet").to_pylist()
    test = [e["name"] for e in ents if e["split"] == "test"]
    stream = corpus_examples(args.seed, args.world_people, args.distractors, world_names(world))
    counts: Counter = Counter()
    for _ in range(2000):
        p, ans = next(stream)
        counts.update(tok.encode(p + ans, add_special_tokens=False))
    pieces = [t for n in test for t in tok.encode(" " + n, add_special_tokens=False)]
    rare = sum(counts[t] < 5 for t in pieces)
    print(json.dumps({"test_names": len(test), "tokens_per_name": round(len(pieces) / max(len(test), 1), 2),
                      "pieces_seen_<5_times_in_2000_examples": rare, "pieces": len(pieces),
                      "example": {n: tok.tokenize(" " + n) for n in test[:4]}}), flush=True)


def _type(f):
    return {"int": int, "float": float, "bool": lambda s: s.lower() in ("1", "true", "yes")}.get(
        str(f.type).replace("None", "").replace("|", "").strip(), str)


if __name__ == "__main__":
    sys.exit(main())
