"""A simulated inventory for machines without GPUs: `--simulate-gpus "4xH100-80GB,2xL4"`.
GPUs of one group are NVLinked in pairs, groups sit on separate NUMA nodes; everything
built from it is marked simulated.
"""

from __future__ import annotations

from noduslocal.daemon.config.values import simulated_groups
from noduslocal.daemon.gpus.model import NVLINK, Gpu, Inventory


def parse(spec: str) -> Inventory:
    gpus: list[Gpu] = []
    groups: list[int] = []
    for group, (count, model, memory_gib) in enumerate(simulated_groups(spec)):
        for _ in range(count):
            index = len(gpus)
            gpus.append(Gpu(
                index=index, uuid=f"GPU-51a0{index:04x}-0000-4000-8000-{index:012x}",
                name=f"NVIDIA {model} {memory_gib}GB (simulated)",
                pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
                memory_total=memory_gib * 2**30, utilization=0, power_mw=0, energy_mj=0,
                numa_node=group))
            groups.append(group)
    n = len(gpus)
    levels = [[0 if i == j else NVLINK if groups[i] == groups[j] and i // 2 == j // 2
               else 30 if groups[i] == groups[j] else 50 for j in range(n)] for i in range(n)]
    return Inventory(gpus, "simulated", f"simulated: {spec}", levels, driver="simulated")
