"""What each rank of a gang runs and is told: the rendezvous environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT and the NCCL settings of its transport) and the launcher's
command line around the job's (Plain, Torchrun, Ray, Verl). Pure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from noduslocal.domain.gang import Gang

# A Ray rank whose launcher gave up before the job's command ran (the cluster did not form
# within startup_timeout) exits 75 (EX_TEMPFAIL), saying why in the rank's log.
_RAY_PYTHON = '''py=python3
ray_bin=$(command -v ray) || { echo "nodus: ray is not on PATH" >&2; exit 75; }
case $(head -c 2 "$ray_bin") in '#!') py=$(head -n 1 "$ray_bin" | cut -c 3-) ;; esac
timeout=${NODUS_STARTUP_TIMEOUT%.*}
deadline=$(( $(date +%s) + timeout ))
ray_opts="--num-gpus=$NODUS_GPUS_PER_NODE --disable-usage-stats --node-ip-address=$NODUS_RANK_ADDR"
'''
# Rank 0: the head, then the job's command once every rank joined. Ray's processes stay in
# the rank's process group, which ends with its main process (not `ray stop`: that stops
# every cluster of the user's on the box). Its files: not the shared /tmp/ray (another
# user's cluster owns that) nor any name another user could make first. mktemp makes a
# new directory (mode 0700, never one that exists, a name nobody can guess) and Ray's own
# temp dir, which Ray opens to everyone, goes inside it. Not under the job's directory:
# Ray's socket paths there would pass the 107 bytes a Unix socket's path may have. Other
# ranks use the head's temp dir.
RAY_HEAD = _RAY_PYTHON + '''tmp=$(mktemp -d "${TMPDIR:-/tmp}/nodus-ray-XXXXXXXXXX") || exit 75
ray start --head --port="$MASTER_PORT" --include-dashboard=false \\
  --temp-dir="$tmp/ray" $ray_opts >&2 || exit 75
"$py" - <<'EOF' || exit 75
import os, sys, time
import ray
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
world = int(os.environ["WORLD_SIZE"])
deadline = time.time() + float(os.environ["NODUS_STARTUP_TIMEOUT"])
while (alive := sum(1 for n in ray.nodes() if n["Alive"])) < world:
    if time.time() > deadline:
        sys.exit(f"nodus: {alive} of {world} Ray nodes joined within the startup timeout")
    time.sleep(0.5)
print(f"nodus: all {world} Ray nodes joined", file=sys.stderr)
EOF
exec "$@"
'''
# Every other rank: join the head (it may not listen yet) and serve it until stopped.
RAY_WORKER = _RAY_PYTHON + '''while :; do
  ray start --address="$MASTER_ADDR:$MASTER_PORT" $ray_opts >&2 && break
  [ "$(date +%s)" -lt "$deadline" ] || { echo "nodus: could not join the Ray head" >&2; exit 75; }
  sleep 1
done
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
'''


@dataclass(frozen=True)
class RankPlan:
    """One rank's part of a gang: who it is, where rank 0 listens, and how ranks talk."""

    gang: Gang
    rank: int
    master_addr: str
    master_port: int
    rank_addr: str  # the address other ranks reach this one at
    job_id: int
    attempt: int
    one_host: bool = True  # False: ranks on a cluster's nodes (its fabric is NCCL's pick)

    def env(self) -> dict[str, str]:
        gang = self.gang
        return {
            "RANK": str(self.rank),
            "NODE_RANK": str(self.rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(gang.nodes),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "NODUS_RANK": str(self.rank),
            "NODUS_WORLD_SIZE": str(gang.nodes),
            "NODUS_GPUS_PER_NODE": str(gang.gpus_per_node),
            "NODUS_RANK_ADDR": self.rank_addr,
            "NODUS_LAUNCHER": gang.launcher,
            "NODUS_STARTUP_TIMEOUT": f"{gang.startup_timeout:g}",
            "NODUS_GANG": f"{self.job_id}-{self.attempt}",
            **(gang.nccl_env() if self.one_host else {}),
            # The job's own ray.init() finds this gang's cluster, not another on the box.
            **({"RAY_ADDRESS": f"{self.master_addr}:{self.master_port}"}
               if gang.ranks_wait_for_head else {}),
        }

    def argv(self, argv: list[str]) -> list[str]:
        """The rank's command line around the job's `argv`."""
        gang = self.gang
        if gang.launcher == "Plain":
            return argv
        if gang.launcher == "Torchrun":
            return torchrun_argv(self, argv)
        trainer = argv
        if gang.launcher == "Verl":
            trainer = [*argv, f"trainer.nnodes={gang.nodes}",
                       f"trainer.n_gpus_per_node={gang.gpus_per_node}"]
        if self.rank == 0:
            return ["sh", "-c", RAY_HEAD, "nodus-ray-head", *trainer]
        return ["sh", "-c", RAY_WORKER, "nodus-ray-worker"]


def torchrun_argv(plan: RankPlan, argv: list[str]) -> list[str]:
    """torchrun runs a Python script or module itself: `python train.py` becomes
    `train.py`, `python -m pkg` `-m pkg`; anything else (`python -c ...`, a program) is
    run as it is, with --no-python."""
    gang = plan.gang
    head = ["torchrun", "--nnodes", str(gang.nodes), "--node_rank", str(plan.rank),
            "--nproc_per_node", str(max(gang.gpus_per_node, 1)),
            "--rdzv_backend", "c10d",
            "--rdzv_endpoint", f"{plan.master_addr}:{plan.master_port}",
            "--rdzv_id", f"nodus-{plan.job_id}-{plan.attempt}"]
    if (len(argv) > 1 and os.path.basename(argv[0]).startswith("python")
            and (argv[1] == "-m" or not argv[1].startswith("-"))):
        return [*head, *argv[1:]]
    return [*head, "--no-python", *argv]
