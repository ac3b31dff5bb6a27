#!/usr/bin/env bash
# Create or refresh .venv-verl: a virtualenv with verl 0.9 for the verl backend of `ragrl rl` and
# tests/backends/test_verl_backend.py, kept apart from .venv because verl pins transformers < 5.11 (see
# requirements-verl.txt). CPU only: no vllm/sglang/flash-attn (a GPU cluster uses envs/verl.yaml).
#
# Idempotent: a stamp holding the hash of requirements-verl.txt, pyproject.toml and this script
# makes a second run a no-op; change any and the venv is refreshed in place.
#
#   scripts/verl_venv.sh                 # uses .venv-verl and python3
#   VERL_VENV=/path PYTHON=python3.11 scripts/verl_venv.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VERL_VENV:-$ROOT/.venv-verl}"
PYTHON="${PYTHON:-python3}"
REQS="$ROOT/requirements-verl.txt"
STAMP="$VENV/.ragrl-verl-installed"
# --no-compile: byte-compiling every installed module (~20,000 files here) was ~90 s of CPU, most
# of it for modules nothing imports; Python compiles what it imports on first use.
PIP=(--quiet --disable-pip-version-check --no-compile)

want="$(cat "$REQS" "$ROOT/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    touch "$STAMP"  # newer than its inputs, for a Makefile rule that depends on them
    echo "verl venv: $VENV is up to date"
    exit 0
fi

start=$SECONDS
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
# Keep git from seeing the venv even where .gitignore does not list it.
echo '*' > "$VENV/.gitignore"
rm -f "$STAMP"
# torch first and pinned: installed as a dependency of verl it would resolve to the newest CUDA build.
"$VENV/bin/python" -m pip install "${PIP[@]}" "$(grep -E '^torch==' "$REQS")"
"$VENV/bin/python" -m pip install "${PIP[@]}" -r "$REQS"
# ragrl itself from the source tree, without its dependencies: verl's Ray workers import our agent
# loop, reward and protocol; ragrl's own pins (transformers 5.23) must not apply. A .pth file rather
# than `pip install -e`: that writes src/ragrl.egg-info, as .venv's install does, so the two venvs
# could not build side by side (this one waited ~3 min for .venv in a fresh `make test`).
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$ROOT/src" > "$site/ragrl-src.pth"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
import verl.experimental.agent_loop.agent_loop  # the imports the backend needs, checked once here
import ragrl.verl.reward
print(f"verl venv: verl {md.version('verl')}, torch {torch.__version__}, transformers {md.version('transformers')}")
PY
echo "$want" > "$STAMP"
echo "verl venv: ready in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1) on disk at $VENV"
