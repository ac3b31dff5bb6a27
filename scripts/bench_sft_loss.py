"""SFT step time with TRL's fused LM head against the plain-logits loss (`sft.fused_lm_head`).

    python scripts/bench_sft_loss.py --data results/sft_data/search_r1.parquet \
        --model results/models/pretrained --steps 30 --batch-size 8 --rounds 2

Trains the same model on the same rows (same seed, same batches) for `--steps` steps with each
loss, alternating the order per round (the machine is shared: a ratio is only as good as the noise
between two neighbouring runs), on one thread as the workflow's SFT jobs run. Both must log the
same training loss; the report says whether they did. JSON to `--out` (default stdout), a
progress line per run to stderr.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from benchlib import add_ab_arguments, alternating_rounds, emit_json

from ragrl.train.sft import SFTArgs, build_trainer

MODES = {"fused": True, "full_logits": False}


def run(mode: str, args, work: Path) -> dict:
    sft = SFTArgs(max_steps=args.steps, batch_size=args.batch_size, lr=1e-3, log_every=10 ** 6,
                  fused_lm_head=MODES[mode])
    trainer = build_trainer(args.model, args.data, work / mode, sft)
    start = time.perf_counter()
    result = trainer.train()
    wall = time.perf_counter() - start
    print(f"[bench-sft-loss] {mode} ({type(trainer).__name__}): {args.steps} steps in {wall:.1f} s, "
          f"train loss {result.training_loss:.5f}", file=sys.stderr, flush=True)
    return {"mode": mode, "wall_s": round(wall, 2), "s_per_step": round(wall / args.steps, 3),
            "train_loss": round(result.training_loss, 6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="an SFT parquet of ragrl sft-data")
    parser.add_argument("--model", required=True, help="the policy to fine-tune (HF directory)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    add_ab_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        rounds = alternating_rounds(list(MODES), args.rounds, lambda m, r: run(m, args, Path(tmp) / f"r{r}"))
    for results in rounds:
        results["speedup_full_logits_over_fused"] = round(results["fused"]["wall_s"] / results["full_logits"]["wall_s"], 3)
        results["same_loss"] = abs(results["fused"]["train_loss"] - results["full_logits"]["train_loss"]) < 1e-4
    emit_json({"data": args.data, "steps": args.steps, "batch_size": args.batch_size, "threads": args.threads,
               "torch": torch.__version__, "rounds": rounds}, args.out)


if __name__ == "__main__":
    main()
