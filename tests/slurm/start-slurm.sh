#!/usr/bin/env bash
# A one-node Slurm on this machine, for the Slurm tests and for trying slurm/*.sbatch by hand.
#
#   tests/slurm/start-slurm.sh [start]   start it (or reuse the one already running); the
#                                        last line on stdout is the slurm.conf to export as
#                                        SLURM_CONF
#   tests/slurm/start-slurm.sh stop      stop its daemons
#   tests/slurm/start-slurm.sh status    exit 0 when it answers, 1 when not
#
# Everything lives in MGPU_SLURM_DIR (default /var/tmp/mgpu-slurm): its own munge key, munged
# socket, slurm.conf, state, spool, logs and pid files. Nothing in /etc is written, and the
# ports (MGPU_SLURMCTLD_PORT, MGPU_SLURMD_PORT; 6917 and 6918) are not Slurm's usual
# 6817/6818, so a system Slurm or munged on the machine is left alone. Slurm's commands find
# this cluster through SLURM_CONF (https://slurm.schedmd.com/slurm.conf.html).
# It needs root (slurmd starts every job as its user) and slurm-wlm + munge, which it installs
# with apt-get when missing (MGPU_SLURM_INSTALL=0: never). Exit 3 means "cannot here", with
# the reason on stderr: the tests skip with it.
set -Eeuo pipefail

STATE_DIR=${MGPU_SLURM_DIR:-/var/tmp/mgpu-slurm}
CTLD_PORT=${MGPU_SLURMCTLD_PORT:-6917}
SLURMD_PORT=${MGPU_SLURMD_PORT:-6918}
# Bounded waits: the daemons start in seconds; a slow shared machine gets some slack.
READY_TIMEOUT_S=${MGPU_SLURM_READY_TIMEOUT:-60}
CONF=$STATE_DIR/slurm.conf
MUNGE_SOCKET=$STATE_DIR/munge/munge.socket
EXIT_CANNOT=3

log() { echo "start-slurm: $*" >&2; }
cannot() { log "cannot start Slurm here: $*"; exit "$EXIT_CANNOT"; }

have_commands() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null \
        && command -v munged >/dev/null
}

install_packages() {
    have_commands && return 0
    [ "$(id -u)" = 0 ] || cannot "slurm-wlm and munge are not installed and this is not root (apt-get install slurm-wlm munge)"
    command -v apt-get >/dev/null || cannot "slurm-wlm and munge are not installed and there is no apt-get"
    [ "${MGPU_SLURM_INSTALL:-1}" = 1 ] || cannot "slurm-wlm and munge are not installed (MGPU_SLURM_INSTALL=0)"
    log "installing slurm-wlm and munge with apt-get"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; } >&2 \
        || cannot "apt-get install slurm-wlm munge failed"
    have_commands || cannot "slurm-wlm is installed but slurmctld/slurmd/srun/munged are not on PATH"
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

answers() {
    # The node idle (or already running a job: mixed/allocated) is a cluster that takes jobs.
    # Without a slurmctld, sinfo would retry for ~10 s before saying so.
    local state
    pid_alive "$STATE_DIR/slurmctld.pid" || return 1
    state=$(SLURM_CONF=$CONF timeout 10 sinfo --noheader --node="$(node_name)" -o %T 2>/dev/null) \
        || return 1
    case $state in idle | mixed | allocated | completing) return 0 ;; *) return 1 ;; esac
}

node_name() { hostname -s; }

start_munge() {
    mkdir -p "$STATE_DIR/munge"
    # munged refuses a key or log in a folder others can write to, and a socket in a folder
    # others cannot enter.
    chmod 0755 "$STATE_DIR" "$STATE_DIR/munge"
    if [ ! -s "$STATE_DIR/munge/munge.key" ]; then
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$STATE_DIR/munge/munge.key"
        else  # munge before 0.5.14
            dd if=/dev/urandom of="$STATE_DIR/munge/munge.key" bs=1024 count=1 status=none
        fi
        chmod 0400 "$STATE_DIR/munge/munge.key"
    fi
    pid_alive "$STATE_DIR/munge/munged.pid" && return 0
    munged --key-file="$STATE_DIR/munge/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$STATE_DIR/munge/munged.pid" --log-file="$STATE_DIR/munge/munged.log" \
        --seed-file="$STATE_DIR/munge/munged.seed" \
        || cannot "munged did not start; see $STATE_DIR/munge/munged.log"
}

write_conf() {
    local node hw
    node=$(node_name)
    # slurmd -C prints this machine's real CPUs, sockets, cores, threads and memory.
    hw=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //')
    mkdir -p "$STATE_DIR/ctld" "$STATE_DIR/slurmd" "$STATE_DIR/log"
    cat >"$CONF.new" <<EOF
# Written by tests/slurm/start-slurm.sh: a one-node cluster on $node for mgpu's tests.
ClusterName=mgpu-test
SlurmctldHost=$node
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
# Its own munged, so a system munge key (or none) does not matter. A requeued job waits
# cred_expire seconds before it may start again (default 120): 20 keeps the tests short.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=20
CredType=cred/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/slurmd/%n
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdLogFile=$STATE_DIR/log/slurmd.log
# No cgroups: containers and CI machines often cannot delegate them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
# Cores are allocated, memory is not (no --mem needed in test jobs).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# A node that came back after a restart takes jobs again without scontrol.
ReturnToService=2
# Jobs may be requeued (scontrol requeue, sbatch --requeue).
JobRequeue=1
# Short kill grace: a stuck test job is gone in seconds, not 30.
KillWait=10
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$node $hw State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    mv "$CONF.new" "$CONF"
}

start_daemons() {
    # -c: no jobs from an earlier session (a requeued job left by a stopped run would take
    # the node and keep the tests' jobs pending).
    pid_alive "$STATE_DIR/slurmctld.pid" \
        || SLURM_CONF=$CONF slurmctld -c -f "$CONF" \
        || cannot "slurmctld did not start; see $STATE_DIR/log/slurmctld.log"
    pid_alive "$STATE_DIR/slurmd.pid" \
        || SLURM_CONF=$CONF slurmd -f "$CONF" \
        || cannot "slurmd did not start; see $STATE_DIR/log/slurmd.log"
}

wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT_S))
    until answers; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            cannot "node $(node_name) not idle after ${READY_TIMEOUT_S} s: $(SLURM_CONF=$CONF sinfo -N 2>&1 | tail -1); see $STATE_DIR/log/"
        fi
        sleep 0.2
    done
}

start() {
    if [ -s "$CONF" ] && answers; then
        log "reusing the running cluster ($CONF)"
        echo "$CONF"
        return 0
    fi
    install_packages
    [ "$(id -u)" = 0 ] || cannot "slurmd must run as root (it starts jobs as their user); this is uid $(id -u)"
    local started
    started=$(date +%s.%N)
    start_munge
    write_conf
    start_daemons
    wait_ready
    log "node $(node_name) idle $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the start; SLURM_CONF=$CONF"
    echo "$CONF"
}

stop_pidfile() {
    local file=$1 pid
    pid_alive "$file" || return 0
    pid=$(cat "$file")
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}

stop() {
    stop_pidfile "$STATE_DIR/slurmd.pid"
    stop_pidfile "$STATE_DIR/slurmctld.pid"
    stop_pidfile "$STATE_DIR/munge/munged.pid"
    log "stopped"
}

case ${1:-start} in
    start) start ;;
    stop) stop ;;
    status) [ -s "$CONF" ] && answers ;;
    *) log "usage: $0 [start|stop|status]"; exit 2 ;;
esac
