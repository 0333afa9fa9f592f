#!/usr/bin/env bash
# Install what the test suite needs on a fresh Debian machine (as root), then run it: a venv
# with the package and its test extra, ruff, and pytest. CI runs all of it (.ci/run).
#
#   scripts/test.sh [unit|daemon|system] [PYTEST ARGS...]
#
# unit:   tests/unit, no daemon and no process, in seconds (only the venv is made if missing)
# daemon: tests/daemon, a real daemon (needs gcc for the NVML stand-in and the compiled shim)
# system: tests/system, root, docker, other Unix users, kill -9, the install, the README tour
# none:   all three
set -euo pipefail
cd "$(dirname "$0")/.."

TIER=all
case "${1:-}" in
    unit|daemon|system) TIER=$1; shift ;;
esac
# for TIER...: whether the tier being run (or all of them) is one of these
needs() {
    [ "$TIER" = all ] && return 0
    local tier
    for tier in "$@"; do [ "$TIER" = "$tier" ] && return 0; done
    return 1
}

log() { printf '\033[1m== %s\033[0m\n' "$*"; }

apt_install() {
    if [ "$(id -u)" != 0 ]; then
        echo "need root to apt-get install $*" >&2
        return 1
    fi
    if [ -z "${APT_UPDATED:-}" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    log "installing python3 (3.11 or newer is needed)"
    apt_install python3 python3-venv
    PYTHON=/usr/bin/python3
fi
if ! "$PYTHON" -m venv --help >/dev/null 2>&1; then
    apt_install python3-venv
fi

# Tests that act as a second Unix user need useradd/runuser and an interpreter that user
# can execute (Debian's /usr/bin/python3; see tests/system/test_multiuser.py).
if needs system && [ "$(id -u)" = 0 ]; then
    command -v useradd >/dev/null && command -v runuser >/dev/null || apt_install passwd util-linux
    [ -x /usr/bin/python3 ] || apt_install python3
    # The groups, made here once: tests that make one remove it after, which would take it
    # from the users of the tests that run beside them in the other process.
    getent group noduslocal >/dev/null || groupadd noduslocal
    getent group noduslocal-admin >/dev/null || groupadd noduslocal-admin
fi

# The NVML tests compile a stand-in libnvidia-ml.so.1 (tests/nvml_standin) with gcc, and the
# host jobs' compiled shim is built with it too.
if needs daemon system && [ "$(id -u)" = 0 ]; then
    command -v gcc >/dev/null && [ -e /usr/include/stdio.h ] || apt_install gcc libc6-dev
fi

# `noduslocal map --dry-run` is checked against GNU parallel's
# (tests/system/test_map_arguments_vs_parallel.py).
if needs system && [ "$(id -u)" = 0 ]; then
    command -v parallel >/dev/null || apt_install parallel
fi

# The dashboard's tests drive Debian's chromium (Playwright, from the test extra, downloads
# no browser of its own).
if needs system && [ "$(id -u)" = 0 ]; then
    command -v chromium >/dev/null || apt_install chromium
fi

# Container tests need a docker engine and two images built here (no registry is reachable).
if needs system; then
    docker_up() { docker info >/dev/null 2>&1; }
    if [ "$(id -u)" = 0 ] && ! docker_up; then
        if ! command -v dockerd >/dev/null; then
            log "installing docker.io"
            apt_install docker.io
        fi
        if ! docker_up; then
            log "starting dockerd (log: /var/log/noduslocal-test-dockerd.log)"
            nohup dockerd >/var/log/noduslocal-test-dockerd.log 2>&1 </dev/null &
            for _ in $(seq 60); do docker_up && break; sleep 1; done
            docker_up || { tail -20 /var/log/noduslocal-test-dockerd.log; exit 1; }
        fi
    fi
    if docker_up; then
        [ -x /bin/busybox ] || apt_install busybox-static
        log "building the test images"
        scripts/build-test-images.sh
    else
        log "no docker engine: the container tests will $([ -n "${CI:-}" ] && echo fail || echo skip)"
    fi
fi

# The Slurm region's tests need a cluster: a two-node one on this host (scripts/slurm-cluster.sh),
# started here when none answers and stopped again when the tests end.
if needs system && [ "$(id -u)" = 0 ]; then
    if ! scripts/slurm-cluster.sh status 2>/dev/null; then
        log "starting a two-node Slurm cluster (scripts/slurm-cluster.sh)"
        if scripts/slurm-cluster.sh up; then
            trap 'scripts/slurm-cluster.sh down >/dev/null 2>&1 || true' EXIT
        else
            log "no Slurm cluster: the Slurm tests will $([ -n "${CI:-}" ] && echo fail || echo skip)"
        fi
    fi
fi

fresh=
if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    "$PYTHON" -m venv .venv
    fresh=1
fi
# The unit tier takes the venv as it is when it has what the tests import.
if [ -n "$fresh" ] || [ "$TIER" != unit ] \
        || ! .venv/bin/python -c 'import noduslocal, pytest, hypothesis' 2>/dev/null; then
    log "installing noduslocal and its test extra into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' \
        >.venv/pip.log 2>&1 || { cat .venv/pip.log; exit 1; }
fi
if needs daemon system; then
    log "building the compiled shim (host jobs' per-attempt supervisor)"
    .venv/bin/python -m noduslocal.daemon.runtime.compiled_shim >/dev/null
fi

log "ruff"
.venv/bin/ruff check noduslocal tests scripts

if [ "$TIER" = all ] && [ $# = 0 ]; then
    # Two processes at once, as the tiers allow: tests/system one test after another (its
    # tests restart dockerd, add Unix users, mount and fill disks: nothing two of them may
    # do at once), and beside it tests/unit and tests/daemon over pytest-xdist workers a
    # module at a time (a daemon-tier module shares one daemon and touches nothing outside
    # its temporary directories). NODUS_TEST_WORKERS=0 runs everything in one process.
    WORKERS=${NODUS_TEST_WORKERS:-2}
    if [ "$WORKERS" = 0 ]; then
        log "pytest"
        .venv/bin/python -m pytest -q -p no:cacheprovider
        exit 0
    fi
    # The Slurm region's tests (marker slurm) mostly wait on the cluster's scheduler, and
    # those marked beside (the dashboard's in a browser, the staged install's) on a browser,
    # pip and running jobs; they touch nothing the other system tests do (their own users,
    # their own daemon): a third process beside them, which evens the two out.
    system_log=$(mktemp /tmp/noduslocal-system-tests.XXXXXX)
    slurm_log=$(mktemp /tmp/noduslocal-slurm-tests.XXXXXX)
    log "pytest tests/system in the background (its report follows; log: $system_log)"
    .venv/bin/python -m pytest -q -p no:cacheprovider -m "not slurm and not beside" tests/system \
        >"$system_log" 2>&1 &
    system_pid=$!
    log "pytest -m 'slurm or beside' tests/system in the background (log: $slurm_log)"
    .venv/bin/python -m pytest -q -p no:cacheprovider -m "slurm or beside" tests/system \
        >"$slurm_log" 2>&1 &
    slurm_pid=$!
    trap 'kill "$system_pid" "$slurm_pid" 2>/dev/null || true' INT TERM
    log "pytest tests/unit tests/daemon ($WORKERS workers)"
    rest=0
    .venv/bin/python -m pytest -q -p no:cacheprovider -n "$WORKERS" --dist loadfile \
        tests/unit tests/daemon || rest=$?
    system=0
    wait "$system_pid" || system=$?
    slurm=0
    wait "$slurm_pid" || slurm=$?
    log "pytest tests/system"
    cat "$system_log"
    log "pytest -m 'slurm or beside' tests/system"
    cat "$slurm_log"
    [ "$system" = 0 ] && rm -f "$system_log"
    [ "$slurm" = 0 ] && rm -f "$slurm_log"
    [ "$rest" = 0 ] || exit "$rest"
    [ "$system" = 0 ] || exit "$system"
    exit "$slurm"
fi
if [ "$TIER" = all ]; then  # the arguments name what to run
    log "pytest"
    .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
    exit 0
fi
WORKERS=0
[ "$TIER" = daemon ] && WORKERS=${NODUS_TEST_WORKERS:-2}
SPREAD=()
[ "$WORKERS" != 0 ] && SPREAD=(-n "$WORKERS" --dist loadfile)
log "pytest tests/$TIER"
.venv/bin/python -m pytest -q -p no:cacheprovider "${SPREAD[@]}" "tests/$TIER" "$@"
