#!/usr/bin/env python
"""Rollout throughput and the share of rollout time spent waiting for retrieval; RL step time.

Usage (after `make run`, from the repository root, venv active):
    python scripts/bench_rollout.py --model results/models/search_r1/sft_merged \
        --index results/index/world/flat --qa results/world/qa/test.parquet --questions 40
    python scripts/bench_rollout.py ... --env multi_query_search --max-queries 3

Prints a JSON line and a markdown row. RL step times come from the training logs the workflow
wrote (results/train/<recipe>/train_log.jsonl), summarised with --train-logs.

--force-search: a policy that searches on every turn, so the retrieval share is measured on
rollouts that actually retrieve (the toy SFT models rarely emit a well-formed <search>). Each turn
is "<search>" + up to 16 tokens the model decodes (real generation cost) + "</search>"; the
forced answer turn is decoded freely. Tokens/s counts decoded tokens only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pyarrow.parquet as pq


def bench_rollouts(args) -> dict:
    from ragrl.agent.environments import make_environment
    from ragrl.agent.generation import HFGenerator
    from ragrl.agent.retriever_adapter import AgentRetriever
    from ragrl.agent.rollout import RolloutConfig, RolloutEngine
    from ragrl.retrieval.searcher import load_searcher

    searcher = load_searcher(args.index, None, "dense")
    env = make_environment(args.env, AgentRetriever(searcher), topk=args.topk, max_queries=args.max_queries)
    generator = HFGenerator.from_pretrained(args.model)
    if args.force_search:
        generator = ForcedSearch(generator, generator.tokenizer)
    engine = RolloutEngine(generator, generator.tokenizer, env,
                           RolloutConfig(max_turns=3, max_turn_tokens=64, max_response_tokens=1024,
                                         max_obs_tokens=512, temperature=1.0, n=args.n))
    questions = pq.read_table(args.qa, columns=["question"]).column("question").to_pylist()[: args.questions]
    engine.run_questions(questions[: min(4, len(questions))], n=1)  # warm-up: model and encoder caches
    start = time.perf_counter()
    trajectories = []
    for i in range(0, len(questions), args.batch_size):
        trajectories += engine.run_questions(questions[i : i + args.batch_size], n=args.n, seed=i)
    wall = time.perf_counter() - start
    generated = generator.decoded if args.force_search else sum(t.generated_tokens for t in trajectories)
    observed = sum(t.observation_tokens for t in trajectories)
    # env_time_s charges each searching trajectory the whole batched call; count each turn's call
    # once per batch by taking the max over trajectories of a batch and turn — approximated here
    # by the per-batch maximum, which is exact when every trajectory searches in every turn.
    env_wall = 0.0
    for i in range(0, len(trajectories), args.batch_size * args.n):
        env_wall += max((t.env_time_s for t in trajectories[i : i + args.batch_size * args.n]), default=0.0)
    return {
        "model": str(args.model), "env": args.env, "trajectories": len(trajectories), "wall_s": round(wall, 2),
        "generated_tokens": generated, "observation_tokens": observed,
        "generated_tokens_per_s": round(generated / wall, 1),
        "searches_per_trajectory": round(statistics.mean(t.num_searches for t in trajectories), 2),
        "retrieval_wait_share": round(env_wall / wall, 3),
    }


class ForcedSearch:
    """Wraps a generator: every turn that is not the forced answer turn becomes a search whose
    query the model decodes (at most 16 tokens)."""

    def __init__(self, inner, tokenizer) -> None:
        self.inner, self.tokenizer = inner, tokenizer
        self.open = tokenizer.encode("<search>", add_special_tokens=False)
        self.close = tokenizer.encode("</search>", add_special_tokens=False)
        self.answer_open = tokenizer.encode("<answer>", add_special_tokens=False)
        self.decoded = 0

    def keep_prefixes(self):
        # The engine's rollout span reaches the wrapped generator (the forced tokens differ from
        # what it generated, so it reuses the common prefix only).
        from ragrl.agent.generation import keep_prefixes

        return keep_prefixes(self.inner)

    def generate(self, batch, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, *, stop_token_ids=(),
                 stop_strings=()):
        limits = [max_new_tokens] * len(batch) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        # The forced answer turn ends its context with the prefilled <answer>: decode it freely.
        free = [list(ids[-len(self.answer_open):]) == self.answer_open for ids in batch]
        prompts = [ids if f else list(ids) + self.open for ids, f in zip(batch, free)]
        budget = [lim if f else min(16, max(lim - len(self.open) - len(self.close), 1)) for lim, f in zip(limits, free)]
        outs = self.inner.generate(prompts, budget, temperature, top_p, seed, stop_token_ids=stop_token_ids,
                                   stop_strings=stop_strings)
        self.decoded += sum(len(o) for o in outs)
        result = []
        for out, f in zip(outs, free):
            if f:
                result.append(out)
                continue
            query = [t for t in out if t not in self.close and t not in self.open and t not in stop_token_ids]
            result.append(self.open + (query or self.tokenizer.encode("x", add_special_tokens=False)) + self.close)
        return result


def summarise_train_logs(paths: list[Path]) -> list[dict]:
    out = []
    for path in paths:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [r["step_time_s"] for r in rows]
        rollout = [r.get("rollout_time_s", 0.0) for r in rows]
        out.append({"log": str(path), "steps": len(rows), "step_time_s_median": round(statistics.median(steps), 2),
                    "rollout_share": round(sum(rollout) / sum(steps), 3)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--env", default="search")
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--max-queries", type=int, default=1)
    p.add_argument("--questions", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--train-logs", type=Path, nargs="*", default=[])
    p.add_argument("--force-search", action="store_true", help="search on every turn (see module docstring)")
    args = p.parse_args()
    result = {"rollouts": bench_rollouts(args), "training": summarise_train_logs(args.train_logs)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
