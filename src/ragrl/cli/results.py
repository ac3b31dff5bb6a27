"""`ragrl run-manifest | results ... | query`: what a run was, and the results database."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _cmd_run_manifest(args: argparse.Namespace) -> None:
    from ragrl.stages.manifest import run_manifest

    manifest = run_manifest(args.run_id, args.recipe_name, args.model, args.stage, json.loads(args.settings),
                            json.loads(args.seeds), args.out)
    print(f"run {args.run_id}: config hash {manifest['config_hash']}, commit {manifest['git_commit']}")


def _cmd_results_build(args: argparse.Namespace) -> None:
    from ragrl.results import build_database

    benchmarks = sorted(Path(args.benchmarks_dir).rglob("*.tsv")) if args.benchmarks_dir else []
    build_database(args.db, runs=args.runs, evals=args.evals, predictions=args.predictions,
                   train_logs=args.train_logs or [], benchmarks=benchmarks, rule_gpus=json.loads(args.rule_gpus),
                   table_specs=json.loads(args.tables), main_metric=args.main_metric,
                   benchmarks_root=args.benchmarks_dir, lineage=json.loads(args.lineage))
    print(f"results database written to {args.db}")


def _cmd_results_tables(args: argparse.Namespace) -> None:
    from ragrl.results import render_delta_tables, render_tables

    specs = json.loads(args.tables)
    for path in [*render_tables(args.db, specs, args.out_dir), *render_delta_tables(args.db, specs, args.out_dir)]:
        print(f"wrote {path}")


def _cmd_results_plots(args: argparse.Namespace) -> None:
    from ragrl.results import plot_families, plot_metrics, plot_paired, plot_reward_curves, plot_training

    for path in [*plot_training(args.db, args.out_dir), plot_reward_curves(args.db, args.out_dir),
                 *(plot_metrics(args.db, args.out_dir, m) for m in args.metrics),
                 *(plot_paired(args.db, args.out_dir, m) for m in args.metrics),
                 *plot_families(args.db, args.out_dir)]:
        print(f"wrote {path}")


def _cmd_query(args: argparse.Namespace) -> None:
    from ragrl.results import query

    query(args.db, args.sql, fmt=args.format, out=args.out)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run-manifest", help="write run.json (run id, recipe, model, config hash, commit, seeds)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--recipe-name", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--stage", required=True)
    p.add_argument("--settings", required=True, help="JSON object: everything that defines the run")
    p.add_argument("--seeds", required=True, help="JSON object")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_run_manifest)

    results = sub.add_parser("results", help="the DuckDB results database, tables and plots").add_subparsers(
        dest="results_command", required=True)
    p = results.add_parser("build", help="build results/ragrl.duckdb from the workflow's output files")
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--runs", nargs="+", required=True, help="run.json files")
    p.add_argument("--evals", nargs="+", required=True, help="metrics.json files")
    p.add_argument("--predictions", nargs="+", required=True, help="predictions.parquet files")
    p.add_argument("--train-logs", nargs="*", help="train_log.jsonl files")
    p.add_argument("--benchmarks-dir", type=Path, help="Snakemake benchmark files (*.tsv) under this dir")
    p.add_argument("--rule-gpus", default="{}", help="JSON: rule → GPUs it requests (for GPU-hours)")
    p.add_argument("--tables", default="[]", help="JSON list of table specs (views table_<name>)")
    p.add_argument("--main-metric", default="em")
    p.add_argument("--lineage", default="{}", help="JSON: run → {family, step, start_run, variant_of, ablation_of}, "
                   "what the paired comparisons come from (ragrl.results.paired)")
    p.set_defaults(func=_cmd_results_build)
    p = results.add_parser("tables", help="paper-style tables (md, csv, tex) from table specs, and each "
                           "table's paired differences (<name>_delta.md, .csv)")
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--tables", required=True, help="JSON list of table specs")
    p.add_argument("--out-dir", type=Path, required=True)
    p.set_defaults(func=_cmd_results_tables)
    p = results.add_parser("plots", help="training and reward curves, runs per family with intervals, "
                           "paired differences (PNG)")
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--metrics", nargs="+", default=["em"])
    p.add_argument("--out-dir", type=Path, required=True)
    p.set_defaults(func=_cmd_results_plots)

    p = sub.add_parser("query", help="run SQL on the results database (read-only)")
    p.add_argument("sql")
    p.add_argument("--db", type=Path, default=Path("results/ragrl.duckdb"))
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--out", type=Path, help="output file (required for parquet)")
    p.set_defaults(func=_cmd_query)
