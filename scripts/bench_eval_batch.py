"""Evaluation batch size and decoding loop: re-run evaluation jobs of a finished `make run` at
several batch sizes, or with ragrl's decoding loop against transformers' `generate`.

    python scripts/bench_eval_batch.py --run-dir RUN_DIR --sizes 25 100 --rounds 2 \
        kg_r1_rl search_r1_rl autograph_r1_rl
    python scripts/bench_eval_batch.py --run-dir RUN_DIR --sizes 100 --decodes ragrl transformers ...

Each job is the command on the first line of RUN_DIR/logs/eval/<run>.log, as the workflow ran it,
with only --batch-size and --out changed (and RAGRL_HF_DECODE set, `ragrl.agent.generation`); one
thread, as Snakemake gives the eval rule. Variants run in alternating order per round
(benchlib.alternating_rounds). Reported per job: wall and CPU time (benchlib.run_measured), the
rollout time of each dataset (its `[done]` line, without imports and model load), and how many
responses equal those of the first variant. JSON to `--out` (default stdout), a progress line per
job to stderr. docs/BENCHMARKS.md, "Evaluation batch size" and "ragrl's decoding loop".
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

import polars as pl
from benchlib import (add_ab_arguments, alternating_rounds, emit_json, loadavg, logged_command, machine_info, ragrl_cmd,
                      run_measured, with_option)

DONE = re.compile(r"^\[done\] eval \S+?/(\S+): .* in ([0-9.]+)s", re.M)


def measure(run: str, variant: str, args, work: Path) -> dict:
    size, decode = variant.split("/")
    out = work / f"{run}_b{size}_{decode}"
    logged = logged_command(args.run_dir / "logs" / "eval" / f"{run}.log", "eval")
    cmd = ragrl_cmd(*with_option(with_option(logged, "--batch-size", size), "--out", str(out)))
    result = run_measured(cmd, out.with_suffix(".log"), env={"OMP_NUM_THREADS": str(args.threads),
                                                             "MKL_NUM_THREADS": str(args.threads),
                                                             "RAGRL_HF_DECODE": decode})
    log_text = out.with_suffix(".log").read_text()
    result["rollout_s"] = {dataset: float(s) for dataset, s in DONE.findall(log_text)}
    result["responses"] = {p.parent.name: pl.read_parquet(p)["response"].to_list()
                           for p in sorted(out.glob("*/predictions.parquet"))}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="eval runs of the make run (logs/eval/<run>.log)")
    parser.add_argument("--run-dir", type=Path, required=True, help="a checkout that has run `make run`")
    parser.add_argument("--sizes", nargs="+", default=["25", "100"])
    parser.add_argument("--decodes", nargs="+", default=["ragrl"], choices=["ragrl", "transformers"])
    add_ab_arguments(parser)
    args = parser.parse_args()
    args.run_dir = args.run_dir.resolve()
    os.chdir(args.run_dir)  # the job's paths are relative to its checkout
    variants = [f"{size}/{decode}" for size in args.sizes for decode in args.decodes]
    report = {"run_dir": str(args.run_dir), "variants": variants, "threads": args.threads,
              "machine": machine_info(["torch", "transformers"]), "loadavg_before": loadavg(), "jobs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.runs:
            rounds = alternating_rounds(variants, args.rounds,
                                        lambda variant, r: measure(run, variant, args, Path(tmp) / f"r{r}"))
            for measured in rounds:
                first = measured[variants[0]]["responses"]
                for variant in variants:
                    responses = measured[variant].pop("responses")
                    measured[variant]["identical_responses"] = {
                        d: f"{sum(a == b for a, b in zip(first[d], responses[d]))}/{len(first[d])}" for d in first}
            report["jobs"][run] = rounds
    report["loadavg_after"] = loadavg()
    emit_json(report, args.out)


if __name__ == "__main__":
    main()
