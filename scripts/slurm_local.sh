#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for trying the SLURM route and for
# tests/backends/test_slurm.py: munged + slurmctld + slurmd from Debian packages, one node on 127.0.0.1
# with every core, most of the memory and 2 fake GPUs (gpu:a100:2).
#
#   scripts/slurm_local.sh install   # apt packages, munge key, fake GPU devices, slurm.conf, gres.conf
#   scripts/slurm_local.sh start     # start the three daemons (installs first if needed), wait for the node
#   scripts/slurm_local.sh status    # daemons and their pids, sinfo
#   scripts/slurm_local.sh stop      # stop the daemons this script started, by the pids it recorded
#
# Every command is idempotent. Needs root and Debian/Ubuntu (apt-get). Daemons run in the
# background with their pids in $RAGRL_SLURM_STATE/*.pid; stop kills exactly those pids, so a
# SLURM or munge started by someone else on the machine is never touched.
#
# Each setting below marked "why" was found by a failure on this machine (DESIGN.md section 7).

set -euo pipefail

STATE=${RAGRL_SLURM_STATE:-/var/lib/ragrl-slurm}
PARTITION=${RAGRL_SLURM_PARTITION:-debug}
GPUS=2
GPU_TYPE=a100
CONF_DIR=/etc/slurm          # why: the jobstep plugin strips SLURM_CONF, so only the default path works
NODE=localhost               # why: slurmd -N localhost + NodeAddr=127.0.0.1 (the hostname may not resolve)

die() { echo "slurm_local.sh: $*" >&2; exit 1; }
log() { echo "slurm_local.sh: $*"; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (installs packages, writes $CONF_DIR, creates /dev/nvidia*)"
}

have_binaries() {
    command -v munged >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null
}

install_packages() {
    if have_binaries; then
        return
    fi
    command -v apt-get >/dev/null || die "apt-get not found: this script needs Debian or Ubuntu"
    # One apt-get update per machine: the stamp keeps repeated installs (and test runs) fast.
    if [ ! -e "$STATE/.apt-updated" ]; then
        log "apt-get update"
        apt-get update -qq
        mkdir -p "$STATE" && touch "$STATE/.apt-updated"
    fi
    log "installing munge slurmctld slurmd slurm-client"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        munge slurmctld slurmd slurm-client >/dev/null
    have_binaries || die "packages installed but munged/slurmctld/slurmd/sbatch still missing"
}

setup_munge() {
    mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    if [ ! -s /etc/munge/munge.key ]; then
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile /etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    # munged refuses keys and directories it considers insecure; it runs as user munge.
    chown munge:munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
    chmod 0400 /etc/munge/munge.key
    chmod 0755 /run/munge
    chmod 0700 /var/lib/munge /var/log/munge
}

make_fake_gpus() {
    # why: gres.conf File= must name existing character devices; major 195 is NVIDIA's.
    local i
    for ((i = 0; i < GPUS; i++)); do
        [ -c "/dev/nvidia$i" ] || mknod -m 0666 "/dev/nvidia$i" c 195 "$i"
    done
}

write_config() {
    local cpus mem_mb
    # nproc honours OMP_NUM_THREADS: with it set to 1 the node had one CPU and every 2-thread job
    # (tiny_model, embed_shard) pended forever ("PartitionConfig").
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
    # Leave headroom for the OS: slurmd drains a node whose RealMemory exceeds what it finds.
    mem_mb=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.85}' /proc/meminfo)
    mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d" "$STATE/log"
    local conf
    conf=$(cat <<EOF
# Written by scripts/slurm_local.sh: a single-node test cluster. Do not edit by hand.
ClusterName=ragrl
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.own.pid
SlurmdPidFile=$STATE/slurmd.own.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
# why: no cgroup hierarchy to delegate inside a container
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# why: with CR_Core_Memory and no default a job without --mem asks for the whole node
DefMemPerCPU=1000
# why: there is no slurmdbd, so snakemake reads job states from squeue; finished jobs must stay
# visible there long enough (the profile's slurm-status-command: squeue)
MinJobAge=600
ReturnToService=2
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Quiet the errors a plain install logs at every start (no PMIx library, no mailer).
MpiDefault=none
MailProg=/bin/true
# Kill a job quickly once its time limit passes (retries with growing runtime are testable).
KillWait=5
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:$GPU_TYPE:$GPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
# A second, non-default partition on the same node: a job lands there only if asked to, which
# shows that a profile's slurm_partition reached sbatch.
PartitionName=gpu Nodes=$NODE MaxTime=INFINITE State=UP
EOF
)
    local gres
    gres=$(
        echo "# Written by scripts/slurm_local.sh: fake GPUs (mknod c 195 N), enough for scheduling."
        echo "NodeName=$NODE Name=gpu Type=$GPU_TYPE File=/dev/nvidia[0-$((GPUS - 1))]"
    )
    # Rewrite only on change, so a running cluster is not told about a config it does not have.
    if [ "$(cat "$CONF_DIR/slurm.conf" 2>/dev/null)" != "$conf" ]; then
        printf '%s\n' "$conf" >"$CONF_DIR/slurm.conf"
        log "wrote $CONF_DIR/slurm.conf"
        CONFIG_CHANGED=1
    fi
    if [ "$(cat "$CONF_DIR/gres.conf" 2>/dev/null)" != "$gres" ]; then
        printf '%s\n' "$gres" >"$CONF_DIR/gres.conf"
        log "wrote $CONF_DIR/gres.conf"
        CONFIG_CHANGED=1
    fi
}

cmd_install() {
    need_root
    install_packages
    setup_munge
    make_fake_gpus
    write_config
    log "installed (config $CONF_DIR/slurm.conf, state $STATE)"
}

# A pid file names a live daemon only if that pid runs the expected program (pids get reused).
alive() {
    local name=$1 pidfile="$STATE/$1.pid" pid
    [ -s "$pidfile" ] || return 1
    pid=$(cat "$pidfile")
    [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]
}

launch() {
    local name=$1
    shift
    if alive "$name"; then
        log "$name already running (pid $(cat "$STATE/$name.pid"))"
        return
    fi
    # Foreground mode (-F/-D) so that $! is the daemon itself, not a parent that exits.
    setsid "$@" >>"$STATE/log/$name.out" 2>&1 </dev/null &
    echo $! >"$STATE/$name.pid"
    sleep 1
    alive "$name" || die "$name exited at start; see $STATE/log/$name.out and $STATE/log/"
    log "started $name (pid $(cat "$STATE/$name.pid"))"
}

wait_for_node() {
    local i state
    for ((i = 0; i < 60; i++)); do
        state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n1 || true)
        case "$state" in
            idle | mixed | allocated) log "node $NODE is $state"; return ;;
        esac
        sleep 1
    done
    die "node $NODE did not become idle (state '${state:-none}'); see $STATE/log/slurmctld.log and slurmd.log"
}

cmd_start() {
    need_root
    CONFIG_CHANGED=0
    cmd_install
    mkdir -p "$STATE/log"
    if [ "$CONFIG_CHANGED" = 1 ] && { alive slurmctld || alive slurmd; }; then
        # Node and GRES changes need the daemons restarted, not just `scontrol reconfigure`.
        log "configuration changed: restarting slurmctld and slurmd"
        stop_one slurmd
        stop_one slurmctld
    fi
    launch munged setpriv --reuid=munge --regid=munge --init-groups munged -F
    # why -c: a controller that is not running left its jobs behind with the machine or container
    # that ran them (a killed test run, a CI image taken mid-run); recovering them brings back
    # jobs no slurmd has and node states (drain) no one set here. A cold start is a fresh cluster,
    # and so is a restart for a changed configuration (jobs still queued or running are lost:
    # this is a test cluster).
    launch slurmctld slurmctld -D -c
    launch slurmd slurmd -D -N "$NODE"
    wait_for_node
}

stop_one() {
    local name=$1 pidfile="$STATE/$1.pid" pid i
    if ! alive "$name"; then
        rm -f "$pidfile"
        return
    fi
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for ((i = 0; i < 30; i++)); do
        [ -d "/proc/$pid" ] || break
        sleep 0.5
    done
    if [ -d "/proc/$pid" ]; then
        log "$name (pid $pid) ignored SIGTERM for 15 s, sending SIGKILL"
        kill -KILL "$pid" || true
    fi
    rm -f "$pidfile"
    log "stopped $name (pid $pid)"
}

cmd_stop() {
    # The reverse order of start: jobs' steps end with slurmd, the controller last but munge.
    stop_one slurmd
    stop_one slurmctld
    stop_one munged
}

cmd_status() {
    local name rc=0
    for name in munged slurmctld slurmd; do
        if alive "$name"; then
            echo "$name: running (pid $(cat "$STATE/$name.pid"))"
        else
            echo "$name: not running"
            rc=3
        fi
    done
    if [ $rc -eq 0 ]; then
        sinfo -N -o "%N %P %T %c %m %G"
    fi
    return $rc
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
