"""`ragrl sft-data | sft | merge | rl | eval`: the agent's training stages and its evaluation."""

from __future__ import annotations

import argparse
from pathlib import Path

from ragrl.cli.common import hold_work_dir, load_recipe, searcher_args
from ragrl.errors import InputError


def _backends(args: argparse.Namespace) -> dict:
    """What the recipe's environment reads, from the flags the rule passed (ragrl.stages.agent)."""
    from ragrl.stages.agent import load_backends

    oracle = getattr(args, "oracle", False)
    return load_backends(index=args.index, bm25=args.bm25, mode=args.mode, passages=args.passages, gpu=args.gpu,
                         kg=args.kg, kg_mode=args.kg_mode, kg_url=args.kg_url,
                         kg_dataset=getattr(args, "kg_dataset", None),
                         oracle_qa=args.qa if oracle else None, ranking=getattr(args, "ranking", None))


def _cmd_sft_data(args: argparse.Namespace) -> None:
    from ragrl.stages import agent

    recipe = load_recipe(args)
    agent.sft_data(recipe, args.qa, args.policy, _backends(args), args.out, limit=args.limit or None,
                   server_log=args.server_log)


def _cmd_sft(args: argparse.Namespace) -> None:
    from ragrl.stages import agent

    print(f"SFT model written to {agent.sft(load_recipe(args), args.data, args.policy, args.out)}")


def _cmd_merge(args: argparse.Namespace) -> None:
    from ragrl.train.merge import merge_lora

    print(f"merged checkpoint written to {merge_lora(args.base, args.adapter, args.out)}")


def _cmd_rl(args: argparse.Namespace) -> None:
    from ragrl.stages import agent

    recipe = load_recipe(args)
    # verl queries the retriever over HTTP from its own processes: it gets the index flags, not a
    # loaded searcher. What the environment reads keys the resume check by content, like the
    # policy and the QA file.
    verl = recipe.rl.get("backend") == "verl"
    hold_work_dir(args.out, "rl")
    final = agent.rl(recipe, args.qa, args.policy, {} if verl else _backends(args), args.out,
                     limit=args.limit or None, log_out=args.log_out,
                     flags={"index": args.index, "bm25": args.bm25, "mode": args.mode, "passages": args.passages,
                            "kg": args.kg})
    print(f"RL policy written to {final}")


def _eval_datasets(args: argparse.Namespace) -> list[tuple[str, Path, dict]]:
    """(dataset, qa, backends) per --dataset. --qa, --kg and --kg-mode pair with --dataset by
    position (--kg/--kg-mode given once serve every dataset); datasets that read the same things
    share one loaded copy (the index, a KG)."""
    names, n = args.dataset, len(args.dataset)

    def per_dataset(flag: str, values: list | None, default=None) -> list:
        values = values or [default]
        if len(values) == 1:
            return values * n
        if len(values) != n:
            raise InputError(f"{flag} given {len(values)} times for {n} --dataset ({', '.join(names)}): "
                             "give it once or once per dataset, in the same order")
        return values

    if len(args.qa) != n:
        raise InputError(f"--qa given {len(args.qa)} times for {n} --dataset ({', '.join(names)}): one each")
    kgs, modes = per_dataset("--kg", args.kg), per_dataset("--kg-mode", args.kg_mode, "whole")
    kg_datasets = per_dataset("--kg-dataset", args.kg_dataset)
    loaded: dict[tuple, dict] = {}
    out = []
    for name, qa, kg, mode, kg_dataset in zip(names, args.qa, kgs, modes, kg_datasets, strict=True):
        key = (kg, mode, kg_dataset, qa if args.oracle else None)
        if key not in loaded:
            loaded[key] = _backends(argparse.Namespace(**{**vars(args), "qa": qa, "kg": kg, "kg_mode": mode,
                                                          "kg_dataset": kg_dataset}))
        out.append((name, qa, loaded[key]))
    return out


def _cmd_eval(args: argparse.Namespace) -> None:
    from ragrl.stages import agent

    results = agent.evaluate_run(load_recipe(args), args.model, _eval_datasets(args), args.out, run_id=args.run_id,
                                 max_questions=args.max_questions or None, batch_size=args.batch_size,
                                 temperature=args.temperature, seed=args.seed)
    for dataset, metrics in results.items():
        print(f"{args.run_id} on {dataset}: {metrics['metrics']}")


def _temperature(text: str) -> float | None:
    if text == "recipe":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or 'recipe', got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _recipe_args(p: argparse.ArgumentParser, retriever: bool = True, per_dataset: bool = False) -> None:
    p.add_argument("--recipe", required=True, help="the recipe's settings as one JSON object (from config)")
    p.add_argument("--recipe-name", default="recipe", help="its name in config, used in error messages")
    if retriever:
        searcher_args(p)
        # Methods whose environment queries a KG (input kind "kg") get it here; `eval` takes one
        # per --dataset (each dataset may have its own KG).
        if per_dataset:
            p.add_argument("--kg", type=Path, action="append",
                           help="KG dir for the --dataset in the same position (once: for all)")
            p.add_argument("--kg-mode", choices=["whole", "subgraph"], action="append",
                           help="per --dataset like --kg (default whole)")
        else:
            p.add_argument("--kg", type=Path, help="KG dir for env kg (triples parquet dir or simple KGQA format)")
            p.add_argument("--kg-mode", choices=["whole", "subgraph"], default="whole")
        p.add_argument("--kg-url", help="a running `ragrl serve-kg` (or KG-R1's server) instead of an in-process KG")
        help_ = ("with --kg-url: the dataset_name the queries name (KG-R1's server requires one, e.g. webqsp; a "
                 "serve-kg of several KGs picks its KG by it)")
        if per_dataset:
            p.add_argument("--kg-dataset", action="append", help=help_ + "; per --dataset like --kg (once: for all)")
        else:
            p.add_argument("--kg-dataset", help=help_)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft-data", help="cold-start SFT data: gold, teacher or imported trajectories (sft.source)")
    _recipe_args(p)
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--policy", type=Path, required=True, help="model dir whose tokenizer and template are used")
    p.add_argument("--limit", type=int)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--server-log", type=Path,
                   help="log of a teacher server this job starts (sft.teacher without base_url); default "
                        "logs/serve/<recipe>.teacher.log")
    p.set_defaults(func=_cmd_sft_data)

    p = sub.add_parser("sft", help="supervised fine-tuning (TRL SFTTrainer, loss on generated tokens only)")
    _recipe_args(p, retriever=False)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--policy", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_sft)

    p = sub.add_parser("merge", help="fold a LoRA adapter into a full HF checkpoint (a full model is copied)")
    p.add_argument("--base", type=Path, required=True)
    p.add_argument("--adapter", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_merge)

    p = sub.add_parser("rl", help="RL (GRPO / PPO-clip / PPO with a critic) of the agent on accelerate; resumes from checkpoints")
    _recipe_args(p)
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--policy", type=Path, required=True)
    p.add_argument("--limit", type=int)
    p.add_argument("--out", type=Path, required=True, help="training dir: checkpoints/, train_log.jsonl, final/")
    p.add_argument("--log-out", type=Path, help="where to copy the finished training log")
    p.set_defaults(func=_cmd_rl)

    p = sub.add_parser("eval", help="roll out a checkpoint on QA sets: <out>/<dataset>/predictions.parquet + "
                       "metrics.json for each --dataset")
    _recipe_args(p, per_dataset=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--dataset", required=True, action="append", help="a dataset name (repeat for several)")
    p.add_argument("--qa", type=Path, required=True, action="append",
                   help="the QA parquet of the --dataset in the same position")
    p.add_argument("--max-questions", type=int)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", type=Path, required=True, help="the run's evaluation dir")
    p.add_argument("--oracle", action="store_true",
                   help="oracle retrieval: every query gets its question's supporting passages (from --passages)")
    p.add_argument("--ranking", type=Path,
                   help="ranking.parquet (id, passage_ids): every query gets its question's ranked passages")
    # Greedy is what the workflow's tables report; sampling at the training temperature, several
    # seeds, measures what RL optimises (scripts/rl_ablation.py --sampled).
    p.add_argument("--temperature", type=_temperature, default=0.0,
                   help="0 (default): greedy; > 0: sample at this temperature; 'recipe': the recipe's rollout temperature")
    p.add_argument("--seed", type=int, help="sampling seed (default: the recipe's rollout seed)")
    p.set_defaults(func=_cmd_eval)
