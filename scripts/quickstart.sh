#!/usr/bin/env bash
# From a fresh Debian machine to a few finished jobs: install what is missing, start
# noduslocald (unless one already answers), run a small batch through the CLI and the SDK,
# and print the result. The daemon is left running for the rest of the tour.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

log() { printf '\033[1m== %s\033[0m\n' "$*"; }

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null \
        || ! "$PYTHON" -m venv --help >/dev/null 2>&1; then
    log "installing python3 and python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
    PYTHON=/usr/bin/python3
fi
if [ ! -x .venv/bin/noduslocal ]; then
    log "installing noduslocal into $REPO/.venv"
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check -e . \
        >/tmp/noduslocal-quickstart-pip.log 2>&1 \
        || { cat /tmp/noduslocal-quickstart-pip.log; exit 1; }
fi
if command -v cc >/dev/null || command -v gcc >/dev/null; then
    .venv/bin/python -m noduslocal.daemon.runtime.compiled_shim >/dev/null 2>&1 \
        || log "the compiled shim did not build; host jobs use the Python shim (slower)"
else
    log "no C compiler: host jobs use the Python shim (about 2 ms more per job);" \
        "apt-get install gcc libc6-dev, then rerun, for the compiled one"
fi
export PATH="$REPO/.venv/bin:$PATH"
# A new shell finds the CLI too: as root, linked into /usr/local/bin (unless another
# noduslocal is there); otherwise the last line says the one command that does it.
ON_PATH=""
if [ "$(id -u)" = 0 ] && [ -d /usr/local/bin ]; then
    for tool in noduslocal noduslocald; do
        link=/usr/local/bin/$tool
        if [ ! -e "$link" ] || [ "$(readlink -f "$link")" = "$(readlink -f ".venv/bin/$tool")" ]; then
            ln -sfn "$REPO/.venv/bin/$tool" "$link" && ON_PATH=1
        fi
    done
fi

DAEMON_ARGS=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    log "NVIDIA GPUs on this machine (the daemon reads them through NVML):"
    nvidia-smi -L
    GPUSPEC=1
else
    log "No NVIDIA GPU here: the daemon runs with SIMULATED GPUs (4 x H100, 2 x L4)."
    echo "   Jobs are pinned to them through CUDA_VISIBLE_DEVICES as on a real box; nothing"
    echo "   runs on a GPU. On a GPU machine, start noduslocald without --simulate-gpus."
    DAEMON_ARGS=(--simulate-gpus "4xH100-80GB,2xL4")
    GPUSPEC=H100:2
fi

# Container jobs need a docker engine; a local image is built (no registry needed).
if ! docker info >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    if ! command -v dockerd >/dev/null; then
        log "installing docker.io (container jobs run through dockerd)"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
    fi
    if ! docker info >/dev/null 2>&1; then
        log "starting dockerd (log: /var/log/noduslocal-dockerd.log)"
        setsid dockerd >/var/log/noduslocal-dockerd.log 2>&1 </dev/null &
        for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    fi
fi
DOCKER=""
if docker info >/dev/null 2>&1; then
    if [ ! -x /bin/busybox ] && [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static >/dev/null
    fi
    scripts/build-test-images.sh >/dev/null && DOCKER=1
fi

if noduslocal job list --json >/dev/null 2>&1; then
    log "a noduslocald already answers; using it"
    STARTED=""
else
    mkdir -p /tmp/noduslocal-quickstart
    LOG=/tmp/noduslocal-quickstart/daemon.log
    log "starting noduslocald in the background (log: $LOG)"
    setsid noduslocald "${DAEMON_ARGS[@]}" >"$LOG" 2>&1 < /dev/null &
    STARTED=$!
    for _ in $(seq 100); do
        noduslocal job list --json >/dev/null 2>&1 && break
        sleep 0.1
    done
    noduslocal job list --json >/dev/null
fi

log "1. one attached job: the log streams, the exit code comes back"
noduslocal job run --name "hello-$$" -- sh -c 'echo "hello from $NODUS_JOB (attempt $NODUS_ATTEMPT) in $PWD"'

if noduslocal gpus --json | .venv/bin/python -c \
        'import json, sys; sys.exit(0 if json.load(sys.stdin)["gpus"] else 1)'; then
    log "2. GPU jobs: each gets whole GPUs of its own (the best-connected set)"
    noduslocal gpus
    for i in 1 2 3; do
        noduslocal job run --detach --name "gpu-$$-$i" --gpus "$GPUSPEC" \
            --label "demo=quickstart-$$" -- sh -c 'echo "ran on $CUDA_VISIBLE_DEVICES"; sleep 2' \
            >/dev/null
    done
    echo "   3 jobs asking for $GPUSPEC each; what does not fit waits and says why (a"
    echo "   pending job holds no GPU yet: each prints the GPUs it got once it runs):"
    noduslocal job list --label "demo=quickstart-$$"
    for i in 1 2 3; do
        noduslocal job wait "gpu-$$-$i" >/dev/null
        echo "   gpu-$$-$i: $(noduslocal job logs "gpu-$$-$i")"
    done
else
    log "2. (skipped) the daemon that answers has no GPUs (noduslocal gpus says why)"
fi

log "2b. a batch of 6 one-CPU jobs, queued on this host's CPUs (shard 6 exits 1 on purpose,"
log "    to show below what a failure looks like)"
CPUS=$(nproc)
for i in 1 2 3 4 5 6; do
    noduslocal job run --detach --name "batch-$$-$i" --cpu 1 --label "demo=quickstart-$$" \
        -- sh -c "sleep 1; echo shard $i done; exit \$(( $i == 6 ))" >/dev/null
done
echo "   submitted; $CPUS CPUs, so $CPUS run at once and the rest wait:"
noduslocal job list --label "demo=quickstart-$$"
for i in 1 2 3 4 5 6; do noduslocal job wait "batch-$$-$i" >/dev/null || true; done

log "3. the same from Python (import noduslocal as nodus)"
.venv/bin/python - "$$" <<'PY'
import sys
import noduslocal as nodus

tag = sys.argv[1]
job = nodus.Job.run(name=f"sdk-{tag}", command=["python3", "-c", "print(sum(range(10**6)))"])
done = job.wait(timeout=60)
print(f"   {job.name}: {done.phase}, printed {next(job.iter_logs())}")
try:
    nodus.Job.from_name(f"batch-{tag}-6").wait()
except nodus.errors.JobFailed as exc:
    print(f"   batch-{tag}-6 failed, as announced in 2b: exit code {exc.exit_code}, "
          f"reason {exc.reason}")
PY

if [ -n "$DOCKER" ]; then
    log "4. a container job: as you, with a memory limit, no network, /workspace bound in"
    noduslocal job run --name "box-$$" --label "demo=quickstart-$$" \
        --image noduslocal-test/busybox:1 --memory 64MiB --network none -- \
        sh -c 'echo "uid $(id -u) in $PWD, networks: $(ls /sys/class/net | tr "\n" " ")"'
else
    log "4. (skipped) no docker engine answers, so no container job"
fi

log "5. a sweep: one command over every combination of values, the canary (task 0) first"
noduslocal map --no-code --name "sweep-$$" --max-parallel "$CPUS" --label "demo=quickstart-$$" \
    -- sh -c 'sleep 1; echo "lr=$0 batch=$1"' ::: lr=1e-4,3e-4,1e-3 ::: batch=16,32
noduslocal sweep wait "sweep-$$"
echo "   its report, one row per cell:"
noduslocal sweep status "sweep-$$" --cells

log "result"
noduslocal job list --all --label "demo=quickstart-$$"
if [ -n "$STARTED" ]; then
    echo
    echo "noduslocald keeps running (pid $STARTED). Stop it with: kill $STARTED"
fi
echo
if [ -n "$ON_PATH" ]; then
    echo "noduslocal is on your PATH (/usr/local/bin/noduslocal); try: noduslocal job list --all"
else
    echo "Put noduslocal on your PATH in this shell: export PATH=\"$REPO/.venv/bin:\$PATH\""
fi
