#!/usr/bin/env bash
# A stand-in for scripts/verl_ray_launch.sh where verl cannot train (no GPU): `ragrl rl` with
# `rl.backend: verl` runs it exactly as the real launcher (`bash LAUNCHER VERL_PYTHON OVERRIDES...`,
# in the work dir, with VERL_FILE_LOGGER_PATH set), and it checks the overrides with verl's own
# config composition, then writes what verl would leave behind: an FSDP checkpoint of the start
# policy (world size 1) for verl's real model merger, and one log line per step.
# Used by the CPU twins of the paper configs (tests/workflow/test_paper_twins.py); never by a real run.
set -euo pipefail
PY="$1"; shift
"$PY" -m verl.trainer.main_ppo "$@" --cfg job > verl_cfg_job.txt
exec "$PY" "$(dirname "$0")/verl_standin.py" "$@"
