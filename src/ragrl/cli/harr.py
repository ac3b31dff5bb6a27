"""`ragrl harr-filter | harr-train | harr-eval | harr-recall`: HARR's query-encoder stages."""

from __future__ import annotations

import argparse
from pathlib import Path

from ragrl.cli.common import hold_work_dir, json_arg, load_recipe


def _harr(args: argparse.Namespace):
    """The generator run's recipe (its rollout settings), HARR's settings, and the job's threads."""
    from ragrl.recipe import parse_harr
    from ragrl.stages.harr import set_threads

    set_threads(args.threads)
    return (load_recipe(args) if getattr(args, "recipe", None) else None), parse_harr(args.harr)


def _harr_generator(args: argparse.Namespace):
    from ragrl.stages.harr import GeneratorSource

    return GeneratorSource(args.generator, dict(args.generator_endpoint or {}), args.server_log)


def _cmd_harr_filter(args: argparse.Namespace) -> None:
    from ragrl.stages.harr import filter_stage, served

    recipe, harr = _harr(args)
    with served(_harr_generator(args)) as generator:
        filter_stage(recipe, harr, args.qa, args.index, args.passages, generator, args.out)


def _cmd_harr_train(args: argparse.Namespace) -> None:
    from ragrl.stages.harr import served, train_stage

    hold_work_dir(args.out_dir, "harr")
    recipe, harr = _harr(args)
    with served(_harr_generator(args)) as generator:
        final = train_stage(recipe, harr, args.qa, args.index, args.passages, generator, args.out_dir,
                            use_history=args.history, log_out=args.log_out)
    print(f"HARR encoder written to {final}")


def _cmd_harr_eval(args: argparse.Namespace) -> None:
    from ragrl.stages.harr import eval_stage, served

    recipe, harr = _harr(args)
    with served(_harr_generator(args)) as generator:
        metrics = eval_stage(recipe, harr, args.qa, args.index, args.passages, generator, args.out,
                             run_id=args.run_id, dataset=args.dataset, encoder=args.encoder,
                             use_history=args.history, max_questions=args.max_questions or None,
                             batch_size=args.batch_size)
    print(f"{args.run_id} on {args.dataset}: {metrics['metrics']}")


def _cmd_harr_recall(args: argparse.Namespace) -> None:
    from ragrl.stages.harr import recall_stage

    _, harr = _harr(args)
    recall_stage(harr, args.qa, args.index, args.passages, args.out, run_id=args.run_id, dataset=args.dataset,
                 encoder=args.encoder, use_history=args.history)


def _harr_args(p: argparse.ArgumentParser, generator: bool = True) -> None:
    if generator:
        p.add_argument("--recipe", required=True,
                       help="the generator run's recipe as one JSON object (its rollout settings)")
        p.add_argument("--recipe-name", default="recipe", help="its name in config, used in error messages")
        p.add_argument("--generator", required=True, help="the frozen generator's checkpoint: a dir or a hub id")
        p.add_argument("--generator-endpoint", type=json_arg, default=None,
                       help="JSON: how the generator is served: {base_url, served_name?} (external OpenAI-compatible "
                            "endpoint) or {serve: true | {python, args, startup_timeout_s, served_name}} (a vLLM "
                            "server this job starts and stops); default: loaded in process (HF)")
        p.add_argument("--server-log", type=Path, help="log of the generator server this job starts (with serve)")
    p.add_argument("--harr", required=True, help="config `harr` as one JSON object (ragrl.recipe.parse_harr)")
    p.add_argument("--index", type=Path, required=True, help="the dense index dir (reused unchanged)")
    p.add_argument("--passages", type=Path, required=True, help="the passages parquet the index was built from")
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1, help="torch and FAISS threads (the job's thread count)")
    p.add_argument("--history", action=argparse.BooleanOptionalAction, default=True,
                   help="history-aware states (--no-history: the query alone, the ablation)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("harr-filter", help="HARR: G stochastic rollouts per question with the initial encoder; "
                       "keep the questions whose F1 varies")
    _harr_args(p)
    p.add_argument("--out", type=Path, required=True, help="the kept QA rows (parquet); stats next to it")
    p.set_defaults(func=_cmd_harr_filter)

    p = sub.add_parser("harr-train", help="HARR: GRPO over retrieval steps for the query encoder; resumes")
    _harr_args(p)
    p.add_argument("--out-dir", type=Path, required=True, help="checkpoints/, train_log.jsonl, final/encoder")
    p.add_argument("--log-out", type=Path, help="where to copy the finished training log")
    p.set_defaults(func=_cmd_harr_train)

    p = sub.add_parser("harr-eval", help="HARR: the frozen generator with an encoder, deterministic top-k: "
                       "predictions.parquet + metrics.json")
    _harr_args(p)
    p.add_argument("--encoder", type=Path, help="a trained encoder dir (default: the index's own, frozen)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--max-questions", type=int)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", type=Path, required=True, help="output dir")
    p.set_defaults(func=_cmd_harr_eval)

    p = sub.add_parser("harr-recall", help="HARR: an encoder's recall@k / all@k on the multi-hop questions")
    _harr_args(p, generator=False)
    p.add_argument("--encoder", type=Path, help="a trained encoder dir (default: the index's own, frozen)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--out", type=Path, required=True, help="metrics.json of dataset <dataset>_multihop")
    p.set_defaults(func=_cmd_harr_recall)
