#!/usr/bin/env bash
# Remove Snakemake's lock of this directory when the snakemake that took it is gone (killed with
# -9, out of memory, a lost node) -- never while one still runs here. `make run` calls it first.
#
# A lock is stale exactly when no snakemake process has this directory as its working directory
# (snakemake chdirs into its --directory). Jobs of a killed snakemake can outlive it and still
# write outputs; while one runs here, a new run would start the same job twice, so the lock stays
# and the orphaned jobs are named. Processes of other users whose working directory cannot be read
# are assumed to be elsewhere: Snakemake locks are per user checkout in practice. Jobs a killed
# snakemake submitted to SLURM run on other hosts and are not seen here (docs/CLUSTER.md).
set -euo pipefail

locks=.snakemake/locks
if [ ! -d "$locks" ] || [ -z "$(ls -A "$locks")" ]; then
    exit 0
fi

here=$(pwd -P)
holders=()
orphans=()
for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    [ "$pid" = "$$" ] && continue
    cwd=$(readlink "$proc/cwd" 2>/dev/null) || continue
    [ "$cwd" = "$here" ] || continue
    cmd=$(tr '\0' ' ' < "$proc/cmdline" 2>/dev/null) || continue
    case "$cmd" in
        *unlock_stale.sh*) ;;
        *bin/snakemake*|snakemake*|*"-m snakemake"*) holders+=("$pid: ${cmd:0:120}") ;;
        *"-m ragrl "*) orphans+=("$pid: ${cmd:0:120}") ;;
    esac
done

if [ ${#holders[@]} -gt 0 ]; then
    echo "Snakemake is running in $here; not touching its lock:" >&2
    printf '  %s\n' "${holders[@]}" >&2
    exit 1
fi
if [ ${#orphans[@]} -gt 0 ]; then
    echo "The lock in $here is left by a killed snakemake, but jobs it started still run and write" >&2
    echo "their outputs; wait for them or stop them (kill PID), then run again:" >&2
    printf '  %s\n' "${orphans[@]}" >&2
    exit 1
fi
echo "Removing a stale Snakemake lock (no snakemake runs in $here); incomplete jobs are re-run."
snakemake --unlock --quiet all >/dev/null
