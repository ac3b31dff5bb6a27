#!/usr/bin/env bash
# What one run on a lent GPU machine proves, in about 10 minutes (docs/GPU.md):
#   a CUDA SFT step and GRPO steps of ragrl's trainers in bf16 on a random model of Qwen2.5-0.5B's
#   shape, the GRPO steps under DeepSpeed ZeRO-2 on one GPU, ragrl's GRPO step against TRL's
#   GRPOTrainer on the same model, prompts and reward, HF generate at batch 32 and 256, GPU search
#   equal to CPU search, the query encoder on CUDA; every part's figures in one JSON file.
#
#   scripts/gpu_check.sh [OUT_DIR]                  # default: $OUT if set (the device tool), else gpu_check_out
#   scripts/gpu_check.sh --install-only [OUT_DIR]   # only the wheel install; last line: PYTHONPATH=...
#
# Environment: GPU_CHECK_PYTHON (python3), GPU_CHECK_WHEELS (./wheels), GPU_CHECK_WORK
# (/tmp/ragrl-gpu-check), GPU_CHECK_PARTS (the parts after `model`, default all of PARTS below),
# GPU_CHECK_PART_TIMEOUT (300 s per part), GPU_CHECK_SMOKE=1 (CPU, small shapes: a check of the
# script, no figures), GPU_CHECK_RL_OVERRIDES (a JSON object of RLConfig fields for ragrl's side of
# grpo_vs_trl).
#
# The machine has torch (CUDA), transformers, accelerate, peft and sentence-transformers but no
# network: what else the check imports travels as wheels in ./wheels (see `wheels_help`, run on a
# machine with network). Its python3 may itself be a venv (/opt/torch/.venv on the first machine):
# a venv made over it starts from the base interpreter and loses the CUDA torch, so no venv is
# made. scripts/gpu_wheels.py installs the wheels with `pip install --no-index --no-deps --target
# $WORK/site`, skipping torch and any wheel the machine already has, and $WORK/site goes on
# PYTHONPATH after the machine's own entries. FAISS's GPU wheel (135 MB) is too big to carry:
# without it the search check compares exact search in torch on the GPU with faiss-cpu (or numpy).
#
# Parts run one after the other, each with its own log and JSON, so one failure keeps the others;
# gpu_check.json (rewritten after every part, so a run cut short still leaves one) merges them with
# each part's status, wall time and, for a failed part, its log's tail.
set -uo pipefail
cd "$(dirname "$0")/.."
INSTALL_ONLY=
if [ "${1:-}" = "--install-only" ]; then INSTALL_ONLY=1; shift; fi
case "${1:-}" in -*) echo "usage: scripts/gpu_check.sh [--install-only] [OUT_DIR]; unknown option '$1'" >&2; exit 2;; esac
OUT_DIR=${1:-${OUT:-gpu_check_out}}
WORK=${GPU_CHECK_WORK:-/tmp/ragrl-gpu-check}
PY=${GPU_CHECK_PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-wheels}
PARTS=(sft rl_zero2 grpo_vs_trl generation retrieval)
for p in ${GPU_CHECK_PARTS:-}; do
  case " model ${PARTS[*]} " in *" $p "*) ;; *) echo "GPU_CHECK_PARTS: unknown part '$p' (parts: ${PARTS[*]})" >&2; exit 2;; esac
done
mkdir -p "$OUT_DIR" "$WORK"
OUT_DIR=$(cd "$OUT_DIR" && pwd) WORK=$(cd "$WORK" && pwd)
SITE=$WORK/site

# Modules the parts import (beyond the standard library) -> the wheel that provides each.
declare -A WHEEL=(
  [torch]="(the machine's CUDA torch)" [transformers]=transformers [accelerate]=accelerate [peft]=peft
  [sentence_transformers]=sentence-transformers [tokenizers]=tokenizers [numpy]=numpy [tqdm]=tqdm
  [httpx]=httpx [pyarrow]=pyarrow==26.0.1 [trl]=trl==1.16.0 [datasets]=datasets==5.2.0 [dill]=dill==0.4.1
  [multiprocess]=multiprocess==0.70.19 [xxhash]=xxhash==4.1.0 [deepspeed]=deepspeed==0.19.8
  [hjson]=hjson==3.1.0 [ninja]=ninja==1.13.2 [msgpack]=msgpack==1.2.4 [cpuinfo]=py-cpuinfo==9.0.0
  [einops]=einops==0.8.2 [pydantic]=pydantic [psutil]=psutil
)

wheels_help() {
  cat <<'HELP'
Carry the missing wheels (on a machine with network, from the repository root; about 10 MB
without pyarrow/pandas, which the GPU machine usually has):
  pip download -d wheels --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 \
      hjson==3.1.0 ninja==1.13.2 msgpack==1.2.4 py-cpuinfo==9.0.0 einops==0.8.2
  # DeepSpeed is an sdist on PyPI: build a pure-Python wheel (ops are compiled on first use; ZeRO-2
  # with a torch optimizer needs none).
  DS_BUILD_OPS=0 pip wheel --no-deps --no-build-isolation -w wheels deepspeed==0.19.8
Optional, for FAISS on the GPU (135 MB + CUDA 12 runtime wheels; too big for a 64 MiB transfer):
  pip download -d wheels --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 faiss-gpu==1.15.1
HELP
}

missing() {  # the modules of WHEEL this python cannot import, with PYTHONPATH as exported
  "$PY" - "${!WHEEL[@]}" <<'PYCODE'
import importlib.util, sys
print(" ".join(sorted(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None)))
PYCODE
}

# The machine's own PYTHONPATH stays ahead of the carried wheels: what it provides is the machine's.
# src/ comes first so ragrl is this checkout's whatever the machine has installed.
install_wheels() {
  echo "== installing $WHEELS/*.whl into $SITE (no venv: the machine's python, packages and CUDA torch as they are)"
  if [ -d "$WHEELS" ]; then
    "$PY" scripts/gpu_wheels.py --wheels "$WHEELS" --target "$SITE" --json "$OUT_DIR/install.json" \
      || echo "   the install step failed (above); parts that need the wheels will fail, the others still run"
  else
    echo "   no $WHEELS directory: nothing to install"
  fi
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}:$SITE
  export PATH=$PATH:$SITE/bin  # console scripts of the wheels (ninja, for DeepSpeed's op builds)
}

install_wheels
if [ -n "$INSTALL_ONLY" ]; then
  echo "PYTHONPATH=$PYTHONPATH"
  exit 0
fi

echo "== machine" | tee "$OUT_DIR/machine.log"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import sys, torch; print(sys.executable, sys.version.split()[0], 'torch', torch.__version__, 'from', torch.__file__, 'cuda', torch.version.cuda, torch.cuda.is_available())" 2>&1
} | tee -a "$OUT_DIR/machine.log"

MISSING=$(missing)
if [ -n "$MISSING" ]; then
  echo "== missing modules: $MISSING"
  for m in $MISSING; do echo "   $m: ${WHEEL[$m]}"; done
  wheels_help
  echo "(parts that need them will fail; the others still run)"
fi

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1
CHECK="scripts/gpu_check.py"
STATUS=()
report() {
  "$PY" "$CHECK" report --json "$OUT_DIR/gpu_check.json" --dir "$OUT_DIR" --install "$OUT_DIR/install.json" \
    --machine "$OUT_DIR/machine.log" ${SMOKE[@]+"${SMOKE[@]}"} ${STATUS[@]+"${STATUS[@]}"} >/dev/null \
    || echo "   the report failed: the parts' own JSON files are in $OUT_DIR"
}
part() {  # name, then the command; its log and JSON go to OUT_DIR, its status into gpu_check.json
  local name=$1; shift
  echo "== $name"
  local start=$SECONDS
  rm -f "$OUT_DIR/$name.json"  # an earlier run's figures must not pass for this one's
  timeout "${GPU_CHECK_PART_TIMEOUT:-300}" "$@" >"$OUT_DIR/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc, $((SECONDS - start)) s; log $OUT_DIR/$name.log"
  [ $rc -eq 0 ] || tail -n 15 "$OUT_DIR/$name.log"
  STATUS+=("$name:$rc:$((SECONDS - start))")
  report
}
wanted() {
  local p
  for p in ${GPU_CHECK_PARTS:-${PARTS[*]}}; do [ "$p" = "$1" ] && return 0; done
  return 1
}
ZERO2=src/ragrl/train/deepspeed/accelerate_zero2.yaml
SMOKE=() SMALL=() SMALL_RL=() SMALL_RET=() SMALL_VS=() SMALL_GEN=()
if [ -n "${GPU_CHECK_SMOKE:-}" ]; then  # a CPU run of the same steps on a small shape: checks the script only
  SMOKE=(--smoke) ZERO2=src/ragrl/train/deepspeed/accelerate_zero2_cpu.yaml
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
  SMALL=(--steps 2 --batch-size 2 --seq-len 64) SMALL_RL=(--steps 2 --prompts 4 --group-size 2 --max-new-tokens 8)
  SMALL_RET=(--n 5000 --dim 64)
  SMALL_VS=(--steps 2 --rounds 1 --prompts 4 --group-size 2 --max-new-tokens 8)
  SMALL_GEN=(--batches 4 8 --new-tokens 8 --repeats 1)
fi
RL_OVERRIDES=()
[ -n "${GPU_CHECK_RL_OVERRIDES:-}" ] && RL_OVERRIDES=(--rl-overrides "$GPU_CHECK_RL_OVERRIDES")

# Every other part loads the model this one writes.
part model "$PY" "$CHECK" model "${SMOKE[@]}" --out "$WORK/model" --json "$OUT_DIR/model.json"
wanted sft && part sft "$PY" "$CHECK" sft "${SMOKE[@]}" "${SMALL[@]}" --model "$WORK/model" --work "$WORK" \
  --json "$OUT_DIR/sft.json"
# One process under accelerate + DeepSpeed ZeRO-2 (the config the rl rule uses on 8 GPUs).
wanted rl_zero2 && part rl_zero2 "$PY" -m accelerate.commands.launch --config_file "$ZERO2" --num_processes 1 \
  --main_process_port 29517 "$CHECK" rl "${SMOKE[@]}" "${SMALL_RL[@]}" --model "$WORK/model" \
  --work "$WORK/zero2" --json "$OUT_DIR/rl_zero2.json"
# Plain processes, no DeepSpeed: both trainers as a one-GPU user runs them.
wanted grpo_vs_trl && part grpo_vs_trl "$PY" "$CHECK" grpo_vs_trl "${SMOKE[@]}" "${SMALL_VS[@]}" \
  "${RL_OVERRIDES[@]}" --model "$WORK/model" --work "$WORK/vs_trl" --json "$OUT_DIR/grpo_vs_trl.json"
wanted generation && part generation "$PY" "$CHECK" generation "${SMOKE[@]}" "${SMALL_GEN[@]}" \
  --model "$WORK/model" --json "$OUT_DIR/generation.json"
wanted retrieval && part retrieval "$PY" "$CHECK" retrieval "${SMOKE[@]}" "${SMALL_RET[@]}" --model "$WORK/model" \
  --work "$WORK" --json "$OUT_DIR/retrieval.json"
echo "== report: $OUT_DIR/gpu_check.json"
FAILED=()
for s in "${STATUS[@]}"; do
  IFS=: read -r name rc _ <<<"$s"
  [ "$rc" = 0 ] || FAILED+=("$name")
done
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "== failed: ${FAILED[*]}"
  exit 1
fi
