#!/usr/bin/env bash
# Start a Ray cluster over the current SLURM allocation, run verl's trainer on it, stop Ray.
#
#   scripts/verl_ray_launch.sh VERL_PYTHON [main_ppo overrides...]
#
# `ragrl rl` runs this for a recipe with rl.backend: verl (src/ragrl/verl/launch.py); it can
# also be run by hand inside `salloc`/`sbatch` with the overrides from <work>/overrides.txt.
#
# Inside SLURM the job (this script) runs on the allocation's first node: the Ray head starts here,
# one Ray worker per other node starts through `srun --overlap` (the job step running this script
# already holds the allocation's CPUs, so a second step must be allowed to overlap it), the script
# waits until every node has joined, then runs `python -m verl.trainer.main_ppo` on the head,
# which attaches to the running cluster through RAY_ADDRESS. Outside SLURM it is one node.
# Ray is stopped on exit, failure and signals included (SLURM sends SIGTERM before a kill), so
# a preempted job leaves no daemons behind and its re-run resumes from verl's last checkpoint.
#
# Environment: RAGRL_RAY_HEAD_IP, RAGRL_RAY_PORT (default 6379 + job id mod 1000, so two jobs sharing a node do not
# collide), RAGRL_RAY_JOIN_TIMEOUT_S (default 600), RAGRL_RAY_TMPDIR (Ray's session dir; default
# a per-job directory under /tmp, short enough for Ray's unix socket paths).
set -euo pipefail

PY="${1:?usage: verl_ray_launch.sh VERL_PYTHON [overrides...]}"
shift
RAY="$(dirname "$PY")/ray"
[[ -x "$RAY" ]] || { echo "verl_ray_launch: no ray executable next to $PY" >&2; exit 2; }

JOB="${SLURM_JOB_ID:-local$$}"
PORT="${RAGRL_RAY_PORT:-$((6379 + ${SLURM_JOB_ID:-0} % 1000))}"
JOIN_TIMEOUT="${RAGRL_RAY_JOIN_TIMEOUT_S:-600}"
TMP="${RAGRL_RAY_TMPDIR:-/tmp/ray-$JOB}"

if [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then
    mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
else
    NODES=("$(hostname)")
fi
NNODES=${#NODES[@]}
# The head's address as the other nodes reach it: the first address `hostname -I` lists, unless
# RAGRL_RAY_HEAD_IP names the cluster interface (nodes with several networks).
HEAD_IP="${RAGRL_RAY_HEAD_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}"
HEAD_IP="${HEAD_IP:-127.0.0.1}"
export RAY_ADDRESS="$HEAD_IP:$PORT"

WORKERS_PID=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n "$WORKERS_PID" ]]; then
        kill "$WORKERS_PID" 2>/dev/null || true  # srun forwards the signal to the worker tasks
        wait "$WORKERS_PID" 2>/dev/null || true
    fi
    "$RAY" stop --force >/dev/null 2>&1 || true
    echo "verl_ray_launch: Ray stopped (exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

echo "verl_ray_launch: $NNODES node(s) [${NODES[*]}], head $RAY_ADDRESS"
"$RAY" start --head --node-ip-address="$HEAD_IP" --port="$PORT" --temp-dir="$TMP" --disable-usage-stats

if (( NNODES > 1 )); then
    # One task per other node; --block keeps each worker in the foreground of its task, so killing
    # this srun ends them all.
    srun --overlap --nodes=$((NNODES - 1)) --ntasks=$((NNODES - 1)) --ntasks-per-node=1 \
        --exclude="${NODES[0]}" \
        "$RAY" start --address="$RAY_ADDRESS" --block --disable-usage-stats &
    WORKERS_PID=$!
fi

# Wait until every node is alive in the cluster.
deadline=$((SECONDS + JOIN_TIMEOUT))
while :; do
    alive="$("$PY" -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(sum(n["Alive"] for n in ray.nodes()))' 2>/dev/null | tail -n1 || true)"
    [[ "$alive" == "$NNODES" ]] && break
    if (( SECONDS > deadline )); then
        echo "verl_ray_launch: only ${alive:-0} of $NNODES Ray nodes joined in ${JOIN_TIMEOUT}s" >&2
        exit 1
    fi
    if [[ -n "$WORKERS_PID" ]] && ! kill -0 "$WORKERS_PID" 2>/dev/null; then
        echo "verl_ray_launch: the srun step starting the Ray workers exited" >&2
        exit 1
    fi
    sleep 5
done
echo "verl_ray_launch: all $NNODES node(s) joined"

"$PY" -m verl.trainer.main_ppo "$@"
