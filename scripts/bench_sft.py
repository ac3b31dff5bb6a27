"""SFT throughput, A against B for one SFT setting: `group_by_length`, `fused_lm_head`, `padding_free`,
or `packed_attention` (padding-free rows attending one sequence at a time, against transformers'
SDPA over the whole row under a block mask; both padding-free).

    python scripts/bench_sft.py --compare fused_lm_head --data results/sft_data/search_r1.parquet \
        --model results/models/pretrained --steps 20 --batch-size 8 --rounds 2
    python scripts/bench_sft.py --compare group_by_length ...

Trains the same model on the same rows for `--steps` steps with the setting off and on,
alternating the order per round (benchlib.alternating_rounds), on one thread as the workflow's SFT
jobs run. The figure is trained (non-padding) tokens per second, TRL's logged `num_tokens` over
the wall time: grouped batches start with other rows than random ones, so steps are not
comparable, while with the same batches (`fused_lm_head`, `padding_free`, `packed_attention`) it is the step-time ratio. Also reported:
each mode's share of an epoch's batch tokens that are padding, and its training loss (the two
losses of `fused_lm_head` must agree; `same_loss` says whether they did). JSON to `--out`
(default stdout), a progress line per run to stderr.
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

SETTINGS = ("group_by_length", "fused_lm_head", "padding_free", "packed_attention")


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


def run(setting: str, on: bool, args, work: Path) -> dict:
    flag = {"padding_free": True} if setting == "packed_attention" else {setting: on}
    sft = SFTArgs(max_steps=args.steps, batch_size=args.batch_size, lr=1e-3, log_every=10 ** 6, **flag)
    trainer = build_trainer(args.model, args.data, work / str(on), sft)
    if setting == "packed_attention" and not on:
        trainer.model.set_attn_implementation("sdpa")
    share = 0.0 if trainer.args.padding_free else padding_share(trainer)
    start = time.perf_counter()
    result = trainer.train()
    wall = time.perf_counter() - start
    tokens = max(r.get("num_tokens", 0) for r in trainer.state.log_history)
    print(f"[bench-sft] {setting}={on} ({type(trainer).__name__}): {args.steps} steps in {wall:.1f} s, "
          f"{tokens / wall:.0f} trained tokens/s, padding {share:.1%} of an epoch's batch tokens, "
          f"train loss {result.training_loss:.5f}", file=sys.stderr, flush=True)
    return {"attention": trainer.model.config._attn_implementation, "wall_s": round(wall, 2),
            "s_per_step": round(wall / args.steps, 3), "tokens": int(tokens), "tokens_per_s": round(tokens / wall, 1),
            "padding_share": round(share, 4), "train_loss": round(result.training_loss, 6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare", required=True, choices=SETTINGS, help="the SFTArgs flag to turn off and on")
    parser.add_argument("--data", required=True, help="an SFT parquet of ragrl sft-data")
    parser.add_argument("--model", required=True, help="the policy to fine-tune (HF directory)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    add_ab_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        measured = alternating_rounds(["off", "on"], args.rounds,
                                      lambda m, r: run(args.compare, m == "on", args, Path(tmp) / f"r{r}"))
    for results in measured:
        results["throughput_on_over_off"] = round(results["on"]["tokens_per_s"] / results["off"]["tokens_per_s"], 3)
        results["same_loss"] = abs(results["on"]["train_loss"] - results["off"]["train_loss"]) < 1e-4
    emit_json({"compare": args.compare, "data": args.data, "steps": args.steps, "batch_size": args.batch_size,
               "threads": args.threads, "torch": torch.__version__, "rounds": measured}, args.out)


if __name__ == "__main__":
    main()
