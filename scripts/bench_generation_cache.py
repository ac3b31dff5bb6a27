"""HF generation with ragrl's in-place KV cache against transformers' own DynamicCache.

    python scripts/bench_generation_cache.py --model results/models/autograph_r1/sft_merged \
        --batch 25 --prompt-min 300 --prompt-max 1500 --new-tokens 256 --rounds 2

Generates from the same random-token prompts (left-padded batch, greedy, so both must return the
same tokens; the report says whether they did) with each cache, alternating the order per round
on a shared machine, on one thread as the workflow's jobs run. The defaults are the shape of an
AutoGraph-R1 constructor turn (a document of a few hundred to 1.5k tokens, 256-token turns).
JSON to `--out` (default stdout), a progress line per run to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import transformers
from benchlib import add_ab_arguments, alternating_rounds, emit_json

import ragrl.agent.generation as generation
from ragrl.agent.generation import HFGenerator

CACHES = {"growing": generation.growing_cache,
          "transformers": lambda config: transformers.DynamicCache(config=config)}


def run(name: str, hf: HFGenerator, prompts, args) -> tuple[dict, list[list[int]]]:
    generation.growing_cache = CACHES[name]
    try:
        start = time.perf_counter()
        out = hf.generate(prompts, args.new_tokens, temperature=0)
        wall = time.perf_counter() - start
    finally:
        generation.growing_cache = CACHES["growing"]
    tokens = sum(map(len, out))
    print(f"[bench-generation-cache] {name}: {tokens} new tokens in {wall:.2f} s ({tokens / wall:.0f}/s)",
          file=sys.stderr, flush=True)
    return {"cache": name, "wall_s": round(wall, 3), "new_tokens": tokens, "tokens_per_s": round(tokens / wall, 1)}, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a causal LM (HF directory)")
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--prompt-min", type=int, default=300)
    parser.add_argument("--prompt-max", type=int, default=1500)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    add_ab_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf = HFGenerator.from_pretrained(args.model)
    # No eos: every row generates its whole budget, so both caches do the same work.
    hf.eos_ids = ()
    hf.model.generation_config.eos_token_id = None
    g = torch.Generator().manual_seed(args.seed)
    vocab = hf.model.config.vocab_size
    lengths = torch.randint(args.prompt_min, args.prompt_max + 1, (args.batch,), generator=g).tolist()
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    measured = alternating_rounds(list(CACHES), args.rounds, lambda name, r: run(name, hf, prompts, args))
    rounds = []
    for results in measured:
        outputs = {name: out for name, (_, out) in results.items()}
        row = {name: stats for name, (stats, _) in results.items()}
        row["speedup_growing_over_transformers"] = round(row["transformers"]["wall_s"] / row["growing"]["wall_s"], 3)
        row["same_tokens"] = outputs["growing"] == outputs["transformers"]
        rounds.append(row)
    emit_json({"model": args.model, "batch": args.batch, "prompt_tokens": [args.prompt_min, args.prompt_max],
               "new_tokens": args.new_tokens, "threads": args.threads, "torch": torch.__version__,
               "transformers": transformers.__version__, "rounds": rounds}, args.out)


if __name__ == "__main__":
    main()
