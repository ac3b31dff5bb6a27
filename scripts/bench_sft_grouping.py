"""SFT throughput with random batches against length-grouped batches (`sft.group_by_length`).

    python scripts/bench_sft_grouping.py --data results/sft_data/search_r1.parquet \
        --model results/models/pretrained --steps 40 --batch-size 8 --rounds 2

Trains the same model on the same rows for `--steps` steps in each mode, alternating the order per
round (the machine is shared: a ratio from one round is only as good as the noise between two
neighbouring runs), on one thread as the workflow's SFT jobs run. Also reports the share of the
tokens in an epoch's batches that are padding, from each mode's sampler. Writes JSON to `--out`
(default stdout) and a progress line per run to stderr.
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


def padding_share(trainer) -> float:
    """Padding tokens / all tokens over one epoch of the trainer's batches."""
    batch_size = trainer.args.per_device_train_batch_size
    lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    order = list(trainer._get_train_sampler())
    padded = real = 0
    for start in range(0, len(order), batch_size):
        batch = [lengths[i] for i in order[start:start + batch_size]]
        padded += max(batch) * len(batch)
        real += sum(batch)
    return 1 - real / padded


def run(mode: str, args, work: Path) -> dict:
    sft = SFTArgs(max_steps=args.steps, batch_size=args.batch_size, lr=1e-3, log_every=10 ** 6,
                  group_by_length=mode == "group_by_length")
    trainer = build_trainer(args.model, args.data, work / mode, sft)
    share = padding_share(trainer)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    # The first steps of the two samplers see different rows (the grouped one starts with its
    # longest batch), so the fair figure is trained (non-padding) tokens per second, not steps.
    tokens = max(r.get("num_tokens", 0) for r in trainer.state.log_history)
    print(f"[bench-sft] {mode}: {args.steps} steps in {wall:.1f} s, {tokens / wall:.0f} trained tokens/s, "
          f"padding {share:.1%} of an epoch's batch tokens", file=sys.stderr, flush=True)
    return {"mode": mode, "wall_s": round(wall, 2), "tokens": int(tokens), "tokens_per_s": round(tokens / wall, 1),
            "padding_share": round(share, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="an SFT parquet of ragrl sft-data")
    parser.add_argument("--model", required=True, help="the policy to fine-tune (HF directory)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    add_ab_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        rounds = alternating_rounds(["random", "group_by_length"], args.rounds,
                                    lambda m, r: run(m, args, Path(tmp) / f"r{r}"))
    for results in rounds:
        results["throughput_grouped_over_random"] = round(
            results["group_by_length"]["tokens_per_s"] / results["random"]["tokens_per_s"], 3)
    emit_json({"data": args.data, "steps": args.steps, "batch_size": args.batch_size, "threads": args.threads,
               "torch": torch.__version__, "rounds": rounds}, args.out)


if __name__ == "__main__":
    main()
