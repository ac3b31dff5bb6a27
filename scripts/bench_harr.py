#!/usr/bin/env python
"""HARR's step time split into generation, retrieval and update (docs/BENCHMARKS.md).

Usage (after a run of the HARR overlay, or any run that built the index and a search agent;
from the repository root, venv active):

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONPATH=src python scripts/bench_harr.py \
        --generator results/models/search_r1/sft_merged --index results/index/world/flat \
        --passages results/corpus/world/passages.parquet --qa results/world/qa/train.parquet \
        --steps 3 --questions-per-step 4 --group-size 4

One HARR training step is: G rollouts of each question through the frozen generator, every
<search> answered by the retriever policy (encode the state, FAISS top-K pool, score the pool's
reconstructed vectors, Plackett-Luce draw), then one GRPO update of the query encoder (recompute
the step log-probs with gradients, backward, AdamW). Retrieval is timed inside the environment
(its `_search`), generation is the rest of the rollout, the update is `retriever_grpo.update`.
Wall and CPU (process) seconds are both reported: CPU seconds are what a loaded machine does not
inflate. --force-search (default on) makes every non-final turn a search whose query the model
decodes (scripts/bench_rollout.py's ForcedSearch), so that retrieval is measured on rollouts that
retrieve. Prints a JSON line and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


class Clock:
    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def __enter__(self):
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--generator", type=Path, required=True)
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--passages", type=Path, required=True)
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--questions-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--pool-size", type=int, default=30)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--history", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--force-search", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()

    import torch

    from ragrl.agent.generation import HFGenerator
    from ragrl.agent.rollout import RolloutConfig, RolloutEngine
    from ragrl.recipe import parse_harr
    from ragrl.stages import harr as stage
    from ragrl.train.retriever_grpo import update
    from ragrl.train.retriever_rollout import rollout_groups
    from ragrl.train.retriever_train import step_questions

    stage.set_threads(args.threads)
    harr = parse_harr({"generator": "-", "index": "-", "train_dataset": "-", "eval_datasets": ["-"],
                       "environment": {"topk": args.topk, "pool_size": args.pool_size, "template": "{state}"},
                       "encoder": {"lora_r": args.lora_r, "lora_alpha": 2 * args.lora_r},
                       "train": {"group_size": args.group_size, "questions_per_step": args.questions_per_step,
                                 "steps": args.steps, "lr": 1e-4}})
    world = stage._world(args.index, args.passages)
    policy = stage._policy(world.meta, harr, None, trainable=True)
    env = stage._env(policy, world, harr, use_history=args.history, stochastic=True, seed=0)
    retrieval = Clock()
    inner_search = env._search

    def timed_search(queries, sample_ids=None):
        with retrieval:
            return inner_search(queries, sample_ids)

    env._search = timed_search
    generator = HFGenerator.from_pretrained(args.generator)
    if args.force_search:
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_rollout import ForcedSearch

        generator = ForcedSearch(generator, generator.tokenizer)
    engine = RolloutEngine(generator, generator.tokenizer, env,
                           RolloutConfig(max_turns=3, max_turn_tokens=64, max_response_tokens=1024,
                                         max_obs_tokens=512, temperature=0.0))
    rows = stage._rows(args.qa)
    optimizer = torch.optim.AdamW([q for q in policy.parameters() if q.requires_grad], lr=1e-4)
    steps = []
    for step in range(1, args.steps + 1):
        batch = [rows[i] for i in step_questions(len(rows), step, args.questions_per_step, 0)]
        retrieval.wall = retrieval.cpu = 0.0
        with Clock() as rollout:
            trajectories = rollout_groups(engine, env, batch, args.group_size, seed=stage.step_seed(0, step))
        with Clock() as upd:
            stats = update(policy, world.index, optimizer, trajectories, alpha=harr.train.alpha)
        steps.append({"step": step, "retrieval_steps": int(stats["steps"]),
                      "generation_wall_s": rollout.wall - retrieval.wall, "retrieval_wall_s": retrieval.wall,
                      "update_wall_s": upd.wall, "generation_cpu_s": rollout.cpu - retrieval.cpu,
                      "retrieval_cpu_s": retrieval.cpu, "update_cpu_s": upd.cpu})
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in steps[-1].items()}), flush=True)
    # The first step pays one-off costs (allocator, first backward); the median is over all steps.
    summary = {k: round(statistics.median(s[k] for s in steps), 3) for k in steps[0] if k != "step"}
    summary.update(trajectories_per_step=args.questions_per_step * args.group_size, threads=args.threads,
                   history=args.history, force_search=args.force_search, generator=str(args.generator),
                   passages=len(world.passages))
    print(json.dumps(summary))
    total = sum(summary[f"{p}_wall_s"] for p in ("generation", "retrieval", "update"))
    print("\n| part | median wall s / step | share | median CPU s / step |\n|---|---:|---:|---:|")
    for part in ("generation", "retrieval", "update"):
        print(f"| {part} | {summary[f'{part}_wall_s']:.2f} | {summary[f'{part}_wall_s'] / total:.0%} | "
              f"{summary[f'{part}_cpu_s']:.2f} |")


if __name__ == "__main__":
    main()
