#!/usr/bin/env bash
# Evaluation batch size: re-run evaluation jobs of a finished `make run` at two batch sizes and
# compare time and outputs (docs/BENCHMARKS.md, "Evaluation batch size").
#
#   scripts/bench_eval_batch.sh RUN_DIR OUT_DIR "25 100" kg_r1_rl search_r1_rl autograph_r1_rl
#
# Each job's command is the first line of RUN_DIR/logs/eval/<run>.log, as the workflow ran it,
# with --batch-size and --out replaced. One thread per job, as Snakemake gives the eval rule.
set -euo pipefail
run_dir=$(realpath "$1"); out=$(realpath -m "$2"); sizes=$3; shift 3
mkdir -p "$out"
cd "$run_dir"
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for run in "$@"; do
    cmd=$(head -1 "logs/eval/$run.log" | sed 's/^\$ //')
    for b in $sizes; do
        dir="$out/${run}_b$b"
        rm -rf "$dir"
        # shellcheck disable=SC2001
        job=$(echo "$cmd" | sed "s#--batch-size [0-9]*#--batch-size $b#; s#--out [^ ]*#--out $dir#")
        /usr/bin/time -f "$run batch $b: %e s wall, %U s user" bash -c ".venv/bin/$job" > "$dir.log" 2>&1
        grep -E '^\[done\]' "$dir.log"
        tail -1 "$dir.log"
    done
done
.venv/bin/python - "$out" "$sizes" "$@" <<'PY'
import sys
from pathlib import Path

import polars as pl

out, sizes, runs = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
for run in runs:
    first = out / f"{run}_b{sizes[0]}"
    for pred in sorted(first.glob("*/predictions.parquet")):
        a = pl.read_parquet(pred)
        for b in sizes[1:]:
            other = pl.read_parquet(out / f"{run}_b{b}" / pred.parent.name / "predictions.parquet")
            same = int((a["response"] == other["response"]).sum())
            print(f"{run} {pred.parent.name}: batch {sizes[0]} vs {b}: {same}/{len(a)} responses identical")
PY
