#!/usr/bin/env bash
# What one run on a lent GPU machine proves, in under 10 minutes (docs/GPU.md):
#   a CUDA SFT step and GRPO steps of ragrl's trainers in bf16 on a random model of Qwen2.5-0.5B's
#   shape, the GRPO steps under DeepSpeed ZeRO-2 on one GPU, GPU search equal to CPU search, the
#   query encoder on CUDA; tokens/s, step times and peak memory in one JSON file.
#
#   scripts/gpu_check.sh [OUT_DIR]        # default: $OUT if set (the device tool), else gpu_check_out
#
# The machine has torch (CUDA), transformers, accelerate, peft and sentence-transformers but no
# network: what else the check imports travels as wheels in ./wheels (see `wheels` below, run on a
# machine with network). They are installed into .gpu-venv, a venv over the system packages, so
# the system's CUDA torch is the one used. FAISS's GPU wheel (135 MB) is too big to carry: without
# it the search check compares exact search in torch on the GPU with faiss-cpu (or numpy).
#
# Parts run one after the other, each with its own log and JSON, so one failure keeps the others.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu_check_out}}
WORK=${GPU_CHECK_WORK:-/tmp/ragrl-gpu-check}
PY=${GPU_CHECK_PYTHON:-python3}
mkdir -p "$OUT_DIR" "$WORK"

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
  cat <<'EOF'
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
EOF
}

missing() {
  local mods=()
  for m in "${!WHEEL[@]}"; do mods+=("$m"); done
  "$1" - "${mods[@]}" <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
}

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
"$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"

MISSING=$(missing "$PY")
if [ -n "$MISSING" ] && [ -d wheels ]; then
  echo "== installing from ./wheels into .gpu-venv (missing: $MISSING)"
  [ -x .gpu-venv/bin/python ] || "$PY" -m venv --system-site-packages .gpu-venv
  PY=$PWD/.gpu-venv/bin/python
  ls wheels/*.whl >/dev/null 2>&1 && "$PY" -m pip install -q --no-index --no-deps --find-links wheels wheels/*.whl
  MISSING=$(missing "$PY")
fi
if [ -n "$MISSING" ]; then
  echo "== missing modules: $MISSING"
  for m in $MISSING; do echo "   $m: ${WHEEL[$m]}"; done
  wheels_help
  echo "(parts that need them will fail; the others still run)"
fi

export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
part() {  # name, then the command; its log and JSON go to OUT_DIR
  local name=$1; shift
  echo "== $name"
  local start=$SECONDS
  timeout "${GPU_CHECK_PART_TIMEOUT:-300}" "$@" >"$OUT_DIR/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc, $((SECONDS - start)) s; log $OUT_DIR/$name.log"
  [ $rc -eq 0 ] || tail -n 15 "$OUT_DIR/$name.log"
}

CHECK="scripts/gpu_check.py"
ZERO2=src/ragrl/train/deepspeed/accelerate_zero2.yaml
SMOKE=()
if [ -n "${GPU_CHECK_SMOKE:-}" ]; then  # a CPU run of the same steps on a small shape: checks the script only
  SMOKE=(--smoke) ZERO2=src/ragrl/train/deepspeed/accelerate_zero2_cpu.yaml
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
  SMALL=(--steps 2 --batch-size 2 --seq-len 64) SMALL_RL=(--steps 2 --prompts 4 --group-size 2 --max-new-tokens 8)
  SMALL_RET=(--n 5000 --dim 64)
fi
part model "$PY" "$CHECK" model "${SMOKE[@]}" --out "$WORK/model" --json "$OUT_DIR/model.json"
part sft "$PY" "$CHECK" sft "${SMOKE[@]}" ${SMALL[@]+"${SMALL[@]}"} --model "$WORK/model" --work "$WORK" \
  --json "$OUT_DIR/sft.json"
# One process under accelerate + DeepSpeed ZeRO-2 (the config the rl rule uses on 8 GPUs).
part rl_zero2 "$PY" -m accelerate.commands.launch --config_file "$ZERO2" --num_processes 1 \
  --main_process_port 29517 "$CHECK" rl "${SMOKE[@]}" ${SMALL_RL[@]+"${SMALL_RL[@]}"} --model "$WORK/model" \
  --work "$WORK/zero2" --json "$OUT_DIR/rl_zero2.json"
part retrieval "$PY" "$CHECK" retrieval "${SMOKE[@]}" ${SMALL_RET[@]+"${SMALL_RET[@]}"} --model "$WORK/model" \
  --work "$WORK" --json "$OUT_DIR/retrieval.json"
"$PY" "$CHECK" report --json "$OUT_DIR/gpu_check.json" "$OUT_DIR"/{model,sft,rl_zero2,retrieval}.json >/dev/null
echo "== report: $OUT_DIR/gpu_check.json"
