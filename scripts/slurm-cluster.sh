#!/usr/bin/env bash
# A two-node Slurm cluster on this host, for the tests and benchmarks of the Slurm region:
# munged, slurmctld and two slurmd (n1, n2, two fake GPUs each), started by hand (no systemd).
#
#   scripts/slurm-cluster.sh up       install slurm-wlm and munge if missing, start, wait idle
#   scripts/slurm-cluster.sh down     stop every daemon of it (SIGTERM, then SIGKILL)
#   scripts/slurm-cluster.sh status   exit 0 when slurmctld answers and both nodes work
#
# Facts this rests on are in ../shared/NOTES.md ("Slurm 22.05 from Debian"). Each node is
# given 4 CPUs and 8000 MB whatever this host has (config_overrides), so tests can ask for
# more than one job per node on a 2-core box; nothing here enforces them (no cgroups).
set -euo pipefail

CONF_DIR=/etc/slurm
STATE=/var/spool/slurmctld
LOGS=/var/log/slurm
NODES=(n1 n2)
CHANGED=

log() { printf '\033[1m== %s\033[0m\n' "$*"; }

install() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return 0
    [ "$(id -u)" = 0 ] || { echo "need root to install slurm-wlm and munge" >&2; exit 1; }
    log "installing slurm-wlm and munge"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
}

# FILE from the .new beside it, by rename and only when it differs: a slurmctld or slurmd
# starting meanwhile (`slurmctld -c` forks and reads its config while `up` runs) must never
# read a file truncated for rewriting; one did, found slurm.conf empty, and died.
replace() {
    local file=$1 new
    new="$(dirname "$1")/.$(basename "$1").new"
    if cmp -s "$new" "$file"; then
        rm -f "$new"
    else
        mv -f "$new" "$file"
    fi
}

configure() {
    local host
    host=$(hostname -s)
    mkdir -p "$CONF_DIR" "$STATE" "$LOGS" /var/spool/slurmd /run/munge
    cat >"$CONF_DIR/.slurm.conf.new" <<EOF
# Written by noduslocal's scripts/slurm-cluster.sh: a test cluster on one host.
ClusterName=noduslocal-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE
SlurmctldPidFile=/run/slurmctld.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmdPidFile=/run/slurmd-%n.pid
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# Backfill (and the start estimates it makes) every 2 s, not 30: tests wait for it.
SchedulerParameters=bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# A job that asks for no memory gets 500 MB a CPU, not the whole node (Slurm's default).
DefMemPerCPU=500
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=300
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
GresTypes=gpu
# A job of partition "urgent" cancels (preempts) jobs of "debug" on the nodes it needs.
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
NodeName=n[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=4 RealMemory=8000 Gres=gpu:fake:2 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=n[1-2] MaxTime=INFINITE State=UP PriorityTier=10
EOF
    # Some settings (PreemptType) take a restart of slurmctld, not a reconfigure.
    if [ -f "$CONF_DIR/slurm.conf" ] && ! cmp -s "$CONF_DIR/.slurm.conf.new" "$CONF_DIR/slurm.conf"; then
        CHANGED=1
    fi
    replace "$CONF_DIR/slurm.conf"
    local i
    for i in 0 1 2 3; do
        [ -e "/dev/fakegpu$i" ] || mknod "/dev/fakegpu$i" c 1 3
    done
    cat >"$CONF_DIR/.gres.conf.new" <<EOF
NodeName=n1 Name=gpu Type=fake File=/dev/fakegpu[0-1]
NodeName=n2 Name=gpu Type=fake File=/dev/fakegpu[2-3]
EOF
    replace "$CONF_DIR/gres.conf"
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge /etc/munge/munge.key /run/munge
    chmod 0700 /etc/munge
    chmod 0400 /etc/munge/munge.key
    mkdir -p /var/lib/munge /var/log/munge
    chown munge:munge /var/lib/munge /var/log/munge
}

running() { pgrep -x "$1" >/dev/null; }

ctld_answers() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

nodes_work() {
    # Both nodes known and in a state that takes work (idle, mixed or allocated).
    local states
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
    for n in "${NODES[@]}"; do
        grep -Eq "^$n (idle|mix|alloc|comp)\$" <<<"$states" || return 1
    done
}

up() {
    install
    configure
    if ! running munged; then
        runuser -u munge -- munged
    fi
    if running slurmctld && [ -n "$CHANGED" ]; then
        log "the config changed: restarting slurmctld"
        pkill -TERM -x slurmctld || true
        for _ in $(seq 50); do running slurmctld || break; sleep 0.2; done
    fi
    if ! running slurmctld; then
        slurmctld -i
    fi
    for _ in $(seq 50); do ctld_answers && break; sleep 0.2; done
    ctld_answers || { tail -20 "$LOGS/slurmctld.log" >&2; echo "slurmctld did not answer" >&2; exit 1; }
    local n
    for n in "${NODES[@]}"; do
        pgrep -f "slurmd -N $n\$" >/dev/null || slurmd -N "$n"
    done
    for _ in $(seq 100); do nodes_work && break; sleep 0.2; done
    if ! nodes_work; then
        # A node left DOWN by an earlier run (a kill -9) comes back with an update.
        for n in "${NODES[@]}"; do scontrol update nodename="$n" state=resume 2>/dev/null || true; done
        for _ in $(seq 50); do nodes_work && break; sleep 0.2; done
    fi
    nodes_work || { sinfo -N >&2; tail -20 "$LOGS/slurmd-n1.log" >&2; exit 1; }
    log "slurm cluster up: $(sinfo -h -N -o '%N:%t' | sort -u | tr '\n' ' ')"
}

stop_all() {
    local name signal
    for signal in TERM KILL; do
        for name in slurmd slurmctld; do
            pkill "-$signal" -x "$name" 2>/dev/null || true
        done
        for _ in $(seq 25); do
            running slurmd || running slurmctld || return 0
            sleep 0.2
        done
    done
}

down() {
    stop_all
    pkill -x munged 2>/dev/null || true
    log "slurm cluster down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) ctld_answers && nodes_work ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
