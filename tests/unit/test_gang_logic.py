"""A gang's pure parts without a daemon: the spec parsed from `distributed` and `gpu`,
each rank's share of the GPUs a connected set, the estimate's topology, and the launchers'
environment and command lines."""

from __future__ import annotations

import pytest

from noduslocal.daemon.gpus.model import NVLINK, Gpu, Inventory
from noduslocal.daemon.runtime.launchers import RankPlan
from noduslocal.daemon.scheduler.capacity import Request
from noduslocal.daemon.scheduler.gang_estimate import gang_topology
from noduslocal.daemon.scheduler.gpus import GpuPool
from noduslocal.domain import errors
from noduslocal.domain.gang import Gang, parse_gang
from noduslocal.domain.gpu_request import GpuRequest

GiB = 2**30


def crossed_box() -> Inventory:
    """Four GPUs whose NVLink pairs are 0-2 and 1-3: slicing by index would split them."""
    gpus = [Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", f"0:{i}", 80 * GiB) for i in range(4)]
    levels = [[0, 40, NVLINK, 40], [40, 0, 40, NVLINK], [NVLINK, 40, 0, 40],
              [40, NVLINK, 40, 0]]
    return Inventory(gpus, "nvml", "", levels)


def test_each_rank_gets_a_connected_share_of_the_gangs_set() -> None:
    pool = GpuPool(crossed_box())
    picked = pool.pick_ranks(GpuRequest(4), 2)
    assert picked is not None
    shares = [[g.index for g in picked[:2]], [g.index for g in picked[2:]]]
    assert sorted(map(sorted, shares)) == [[0, 2], [1, 3]]
    assert pool.pick_ranks(GpuRequest(2), 2) is not None  # one GPU a rank: any split
    pool.take(9, ["GPU-0"])
    assert pool.pick_ranks(GpuRequest(4), 2) is None  # all or nothing: never a part


def test_the_estimate_names_the_shares_and_their_links() -> None:
    pool = GpuPool(crossed_box())
    req = Request(1, 1000, 0, gpu=GpuRequest(4), ranks=2)
    doc = gang_topology(pool, req, 2, 2, None)
    assert doc["rank_link"] == "NVLink" and doc["gang_link"] == "NUMA node"
    assert doc["when"] == "now, if it started"
    pool.take(9, ["GPU-0"])
    waiting = gang_topology(pool, req, 2, 2, "needs 4 x GPU, 3 free")
    assert waiting["when"] == "once the GPUs held now are free"
    assert sorted(map(sorted, waiting["rank_gpus"])) == [[0, 2], [1, 3]]
    assert waiting["waits_for"] == "needs 4 x GPU, 3 free"


@pytest.mark.parametrize(("body", "gpu", "want", "gpus"), [
    ({"nodes": 2}, GpuRequest(2, "H100"), Gang(2, 2), GpuRequest(4, "H100")),
    ({"nodes": 3, "gpus_per_node": 1}, None, Gang(3, 1), GpuRequest(3)),
    ({"total_gpus": 8, "gpus_per_node": 4}, None, Gang(2, 4), GpuRequest(8)),
    ({"total_gpus": 4}, None, Gang(4, 1), GpuRequest(4)),
    ({"nodes": 2}, None, Gang(2, 0), None),
    ({"nodes": 2, "gpus_per_node": 4}, GpuRequest(1, "L4"), Gang(2, 4), GpuRequest(8, "L4")),
    ({"nodes": 2, "launcher": "Ray", "transport": "nvlink", "startup_timeout": "2m"}, None,
     Gang(2, 0, "Ray", "nvlink", "local", 120.0), None),
])
def test_gang_forms(body: dict[str, object], gpu: GpuRequest | None, want: Gang,
                    gpus: GpuRequest | None) -> None:
    assert parse_gang(body, gpu) == (want, gpus)


@pytest.mark.parametrize(("body", "gpu", "field", "words"), [
    ({"nodes": 2, "launcher": "Slurm"}, None, "distributed.launcher", "Plain, Torchrun, Ray"),
    ({"nodes": 2, "transport": "infiniband"}, None, "distributed.transport", "one host"),
    ({"total_gpus": 6, "gpus_per_node": 4}, None, "distributed.total_gpus", "multiple"),
    ({"nodes": 3, "total_gpus": 4, "gpus_per_node": 2}, None, "distributed.total_gpus",
     "are 6"),
    ({"nodes": 2, "gpus_per_node": 4}, GpuRequest(2), "distributed.gpus_per_node", "gpu"),
    ({"gpus_per_node": 1}, None, "distributed.nodes", "nodes or total_gpus"),
    ({"nodes": 0}, None, "distributed.nodes", "from 1"),
    ({"nodes": 2, "hosts": 1}, None, "distributed.hosts", "unknown field"),
    ({"nodes": 2, "network": "infiniband"}, None, "distributed.network", "local"),
    ({"nodes": 2, "startup_timeout": 0}, None, "distributed.startup_timeout", "positive"),
    ("two", None, "distributed", "an object"),
])
def test_bad_gangs_name_the_field(body: object, gpu: GpuRequest | None, field: str,
                                  words: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=words) as info:
        parse_gang(body, gpu)
    assert info.value.field == field


def test_a_wrapping_launcher_needs_a_command() -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        parse_gang({"nodes": 2, "launcher": "Torchrun"}, None, has_command=False)
    assert info.value.field == "command"
    assert parse_gang({"nodes": 2}, None, has_command=False) is not None  # Plain: env only


def test_rendezvous_env_and_launcher_command_lines() -> None:
    plan = RankPlan(Gang(2, 2, "Torchrun", "shm"), 1, "head", 1234, "me", 7, 3)
    env = plan.env()
    assert (env["RANK"], env["NODE_RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (
        "1", "1", "0", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("head", "1234")
    assert env["NCCL_P2P_DISABLE"] == "1" and env["NCCL_IB_DISABLE"] == "1"
    head = ["torchrun", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", "head:1234", "--rdzv_id",
            "nodus-7-3"]
    assert plan.argv(["python", "train.py", "--lr", "1"]) == [*head, "train.py", "--lr", "1"]
    assert plan.argv(["./run.sh"]) == [*head, "--no-python", "./run.sh"]
    assert plan.argv(["python3", "-m", "pkg.train"]) == [*head, "-m", "pkg.train"]
    assert plan.argv(["python", "-c", "x"]) == [*head, "--no-python", "python", "-c", "x"]
    plain = RankPlan(Gang(2, 0), 0, "h", 1, "h", 7, 3)
    assert plain.argv(["x"]) == ["x"] and "RAY_ADDRESS" not in plain.env()
    verl = RankPlan(Gang(2, 4, "Verl"), 0, "h", 9, "h", 7, 3)
    argv = verl.argv(["python", "-m", "verl.trainer.main_ppo"])
    assert argv[:2] == ["sh", "-c"] and argv[-2:] == ["trainer.nnodes=2",
                                                      "trainer.n_gpus_per_node=4"]
    assert verl.env()["RAY_ADDRESS"] == "h:9"
    worker = RankPlan(Gang(2, 4, "Ray"), 1, "h", 9, "w", 7, 3).argv(["python", "x.py"])
    assert worker[:2] == ["sh", "-c"] and "x.py" not in worker  # workers serve rank 0


def test_torchrun_argv_and_env_of_a_rank() -> None:
    gang = Gang(nodes=2, gpus_per_node=2, launcher="Torchrun", transport="tcp")
    plan = RankPlan(gang, rank=1, master_addr="host", master_port=1234, rank_addr="host-r1",
                    job_id=7, attempt=2)
    head = ["torchrun", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", "host:1234",
            "--rdzv_id", "nodus-7-2"]
    assert plan.argv(["python", "train.py", "--lr", "1"]) == [*head, "train.py", "--lr", "1"]
    assert plan.argv(["/usr/bin/python3.11", "train.py"]) == [*head, "train.py"]
    assert plan.argv(["./train.sh", "--lr", "1"]) == [*head, "--no-python", "./train.sh",
                                                      "--lr", "1"]
    env = plan.env()
    assert {k: env[k] for k in ("RANK", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE",
                                "MASTER_ADDR", "MASTER_PORT", "NODUS_RANK_ADDR",
                                "NODUS_GANG", "NODUS_LAUNCHER")} == {
        "RANK": "1", "NODE_RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
        "MASTER_ADDR": "host", "MASTER_PORT": "1234", "NODUS_RANK_ADDR": "host-r1",
        "NODUS_GANG": "7-2", "NODUS_LAUNCHER": "Torchrun"}
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_P2P_DISABLE"] == "1"
    assert env["NCCL_SHM_DISABLE"] == "1" and "RAY_ADDRESS" not in env
    cpu_gang = RankPlan(Gang(nodes=3, gpus_per_node=0, launcher="Torchrun"), 0, "h", 1, "h", 1, 1)
    assert cpu_gang.argv(["python", "t.py"])[:6] == ["torchrun", "--nnodes", "3",
                                                     "--node_rank", "0", "--nproc_per_node"]
    assert cpu_gang.argv(["python", "t.py"])[6] == "1"
