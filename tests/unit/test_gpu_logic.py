"""GPU logic without a daemon: request forms, model names, the simulated inventory, the
best-connected pick, foreign processes, refusals with what the box has, and a property
test that no GPU is ever held by two jobs at once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noduslocal.daemon.gpus.model import NVLINK, Gpu, GpuProcess, Inventory, job_env, model_of
from noduslocal.daemon.gpus.service import simulated_inventory
from noduslocal.daemon.scheduler.gpus import GpuPool
from noduslocal.daemon.scheduler.queue import Capacity, Queue, Request
from noduslocal.domain import errors
from noduslocal.domain.gpu_request import GpuRequest, parse_gpu

GiB = 2**30


@pytest.mark.parametrize(("value", "want"), [
    (2, GpuRequest(2)), ("2", GpuRequest(2)), ("H100", GpuRequest(1, "H100")),
    ("h100:2", GpuRequest(2, "H100")), ("2xH100", GpuRequest(2, "H100")),
    ("2 x L4", GpuRequest(2, "L4")), ("gpu_2x_h100", GpuRequest(2, "H100")),
    ({"type": "A100", "count": 4, "min_memory": "40GiB"}, GpuRequest(4, "A100", 40 * GiB)),
    ({"count": 1}, GpuRequest(1)), (None, None), (0, None),
])
def test_request_forms(value: object, want: GpuRequest | None) -> None:
    assert parse_gpu(value) == want


@pytest.mark.parametrize("value", [True, -1, 1025, "2x", "H100:x", "gpu_x_h100", [1],
                                   {"kind": "H100"}, {"count": "2"}, {"type": "H 100"}])
def test_bad_requests_name_the_field(value: object) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        parse_gpu(value)
    assert info.value.field == "gpu"


@pytest.mark.parametrize(("name", "model"), [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA GeForce RTX 4090", "RTX4090"), ("NVIDIA L4", "L4"), ("Tesla T4", "T4"),
])
def test_model_names(name: str, model: str) -> None:
    assert model_of(name) == model


def test_simulated_inventory_and_its_errors() -> None:
    inv = simulated_inventory("4xH100-80GB, 2xL4")
    assert [g.model for g in inv.gpus] == ["H100"] * 4 + ["L4"] * 2
    assert inv.simulated and inv.summary() == "4 x H100 (80 GiB), 2 x L4 (24 GiB)"
    assert inv.link(0, 1) == NVLINK and inv.link(0, 2) == 30 and inv.link(0, 4) == 50
    assert len({g.uuid for g in inv.gpus}) == 6
    for bad in ("", "4xH100-80", "2x", "65xH100", "H100,,-"):
        with pytest.raises(errors.InvalidArgument):
            simulated_inventory(bad)


def box() -> Inventory:
    """Four GPUs: 0-1 NVLinked, 2-3 on one PCIe switch, the pairs on two NUMA nodes."""
    gpus = [Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", f"0:{i}", 80 * GiB) for i in range(4)]
    levels = [[0, NVLINK, 40, 40], [NVLINK, 0, 40, 40], [40, 40, 0, 10], [40, 40, 10, 0]]
    return Inventory(gpus, "nvml", "", levels)


def test_pick_prefers_nvlink_then_one_switch() -> None:
    pool = GpuPool(box())
    picked = pool.pick(GpuRequest(2))
    assert picked is not None and [g.index for g in picked] == [0, 1]
    pool.take(1, [g.uuid for g in picked])
    picked = pool.pick(GpuRequest(2))
    assert picked is not None and [g.index for g in picked] == [2, 3]
    pool.give(1)
    pool.take(2, ["GPU-0"])  # the NVLink pair is broken: a switch pair beats a split
    picked = pool.pick(GpuRequest(2))
    assert picked is not None and [g.index for g in picked] == [2, 3]


def test_foreign_process_makes_a_gpu_busy_and_the_hold_names_it() -> None:
    inv = box()
    inv.gpus[0].processes = [GpuProcess(4242, 21 * GiB, "bob")]
    inv.gpus[1].memory_used = 5 * GiB
    pool = GpuPool(inv)
    assert [g.index for g in pool.free(GpuRequest(1))] == [2, 3]
    pool.take(7, ["GPU-2", "GPU-3"])
    hold = pool.wait_reason(GpuRequest(1))
    assert "needs 1 x GPU, 0 free" in hold
    assert "GPU 0 busy: pid 4242 (bob) holds 21 GiB" in hold
    assert "GPU 1 busy: 5.0 GiB used" in hold
    inv.gpus[1].healthy, inv.gpus[1].problem = False, "Xid 79"
    assert "GPU 1 unhealthy: Xid 79" in pool.wait_reason(GpuRequest(1))


def test_refusal_lists_what_the_box_has() -> None:
    pool = GpuPool(box())
    assert pool.refusal(GpuRequest(4, "H100")) is None
    assert pool.refusal(GpuRequest(5)) == ("gpu: 5 x GPU requested; this host has "
                                           "4 x H100 (80 GiB)")
    assert "1 x A100" in (pool.refusal(GpuRequest(1, "A100")) or "")
    assert pool.refusal(GpuRequest(1, min_memory=96 * GiB)) is not None


def test_job_env_pins_host_jobs_and_leaves_containers_to_docker() -> None:
    gpus = box().gpus[2:4]
    host = job_env(gpus, True, in_container=False, simulated=False)
    assert host["CUDA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"
    assert host["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert '"uuid": "GPU-3"' in host["NODUS_GPUS"]
    assert "CUDA_VISIBLE_DEVICES" not in job_env(gpus, True, True, simulated=False)
    assert job_env(gpus, True, True, simulated=True)["CUDA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"
    assert job_env([], True, False, False)["CUDA_VISIBLE_DEVICES"] == ""  # none asked, none seen


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=40),
       st.randoms(use_true_random=False))
def test_no_gpu_is_ever_held_twice(jobs: list[tuple[int, bool]], rnd: object) -> None:
    """Random mixes of GPU and CPU-only jobs, started and ended in random order: at no
    point do two running jobs hold one GPU, nor is more held than exists."""
    inv = box()
    queue = Queue(Capacity(8000, 64 * GiB, gpus=GpuPool(inv)))
    running: list[Request] = []
    for job_id, (count, ends_first) in enumerate(jobs, start=1):
        queue.push(Request(job_id, 1000, GiB, gpu=GpuRequest(count) if count else None))
        if ends_first and running:
            done = running.pop(rnd.randrange(len(running)))  # type: ignore[attr-defined]
            queue.capacity.give(done)
        running += queue.schedule()
        pool = queue.capacity.gpus
        assert pool is not None
        held = [u for r in running for u in pool.by_job.get(r.job_id, [])]
        assert len(held) == len(set(held)) <= len(inv.gpus)
        assert all(len(pool.by_job.get(r.job_id, [])) == (r.gpu.count if r.gpu else 0)
                   for r in running)


def test_containers_never_see_gpus_they_were_not_given() -> None:
    gpus = box().gpus[:1]
    assert job_env(gpus, True, True, simulated=False)["NVIDIA_VISIBLE_DEVICES"] == "GPU-0"
    assert job_env([], True, True, simulated=False)["NVIDIA_VISIBLE_DEVICES"] == "void"
    # A simulated GPU is no real one: a container is given none, whatever it asks for.
    assert job_env(gpus, True, True, simulated=True)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "NVIDIA_VISIBLE_DEVICES" not in job_env(gpus, True, False, simulated=False)
