#!/usr/bin/env bash
# Before a run in this directory: remove Snakemake's lock when the snakemake that took it is gone
# (killed with -9, out of memory, a lost node) -- never while one still runs here -- and refuse
# while jobs that no running snakemake owns still run here. `make run` calls it first.
#
# A lock is stale exactly when no snakemake process has this directory as its working directory
# (snakemake chdirs into its --directory). Job processes can outlive what started them: a killed
# snakemake leaves its jobs running, and so does a killed job wrapper (`bash -c`), after which
# snakemake exits normally and leaves no lock at all (issue 34 F6). So the jobs are looked for
# whether or not there is a lock: a ragrl process (`python -m ragrl`, `bin/ragrl`) working here
# with no live snakemake among its ancestors is an orphan (or was started by hand), and a new run
# would start the same job twice; it is named and nothing is touched. Jobs of a live snakemake
# are that snakemake's business. Resumable jobs (RL, construct-kg, ...) also lock their work
# directory for as long as they run (ragrl.workdir), which covers jobs this scan cannot see.
# Processes of other users whose working directory cannot be read are assumed to be elsewhere.
# Jobs a killed snakemake submitted to SLURM run on other hosts and are not seen here
# (docs/CLUSTER.md).
set -euo pipefail

locks=.snakemake/locks
locked=false
if [ -d "$locks" ] && [ -n "$(ls -A "$locks")" ]; then
    locked=true
fi

is_snakemake() {  # $1: a command line
    case "$1" in
        *unlock_stale.sh*) return 1 ;;
        *bin/snakemake*|snakemake*|*"-m snakemake"*) return 0 ;;
    esac
    return 1
}

under_snakemake() {  # $1: pid; true when a live snakemake is among its ancestors
    local pid=$1 stat ppid cmd
    while :; do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
        stat=${stat##*) }       # the fields after "(comm)", which may hold spaces
        read -r _ ppid _ <<< "$stat"
        [ "$ppid" -gt 1 ] || return 1
        cmd=$(tr '\0' ' ' < "/proc/$ppid/cmdline" 2>/dev/null) || return 1
        if is_snakemake "$cmd"; then return 0; fi
        pid=$ppid
    done
}

here=$(pwd -P)
holders=()
orphans=()
for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    [ "$pid" = "$$" ] && continue
    cwd=$(readlink "$proc/cwd" 2>/dev/null) || continue
    [ "$cwd" = "$here" ] || continue
    cmd=$(tr '\0' ' ' < "$proc/cmdline" 2>/dev/null) || continue
    if is_snakemake "$cmd"; then
        holders+=("$pid: ${cmd:0:120}")
        continue
    fi
    case "$cmd" in
        *unlock_stale.sh*) ;;
        *"-m ragrl "*|*bin/ragrl\ *)
            under_snakemake "$pid" || orphans+=("$pid: ${cmd:0:120}") ;;
    esac
done

if $locked && [ ${#holders[@]} -gt 0 ]; then
    echo "Snakemake is running in $here; not touching its lock:" >&2
    printf '  %s\n' "${holders[@]}" >&2
    exit 1
fi
if [ ${#orphans[@]} -gt 0 ]; then
    if $locked; then
        echo "The lock in $here is left by a killed snakemake, but jobs it started still run and write" >&2
        echo "their outputs; wait for them or stop them (kill PID), then run again:" >&2
    else
        echo "ragrl jobs that no running snakemake owns still run in $here (left by a killed snakemake" >&2
        echo "or job wrapper, or started by hand) and write their outputs; a new run would start them a" >&2
        echo "second time. Wait for them or stop them (kill PID), then run again:" >&2
    fi
    printf '  %s\n' "${orphans[@]}" >&2
    exit 1
fi
if $locked; then
    echo "Removing a stale Snakemake lock (no snakemake runs in $here); incomplete jobs are re-run."
    snakemake --unlock --quiet all >/dev/null
fi
