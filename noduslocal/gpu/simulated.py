"""A simulated inventory for machines without GPUs: `--simulate-gpus "4xH100-80GB,2xL4"`.
GPUs of one group are NVLinked in pairs, groups sit on separate NUMA nodes; everything
built from it is marked simulated.
"""

from __future__ import annotations

import re

from noduslocal.errors import InvalidArgument
from noduslocal.gpu.model import NVLINK, Gpu, Inventory

# Memory of models when the spec does not say (GiB).
KNOWN_MEMORY = {"H100": 80, "H200": 141, "A100": 80, "L4": 24, "L40S": 48, "A10": 24,
                "T4": 16, "V100": 32, "RTX4090": 24, "B200": 192}
GROUP_RE = re.compile(r"^(?:(\d+)\s*x\s*)?([A-Za-z][A-Za-z0-9]*)(?:-(\d+)\s*GB)?$", re.I)


def parse(spec: str) -> Inventory:
    gpus: list[Gpu] = []
    groups: list[int] = []
    for group, part in enumerate(p.strip() for p in spec.split(",") if p.strip()):
        match = GROUP_RE.match(part)
        if not match:
            raise InvalidArgument(
                f"simulate_gpus: {part!r} is not COUNTxMODEL[-MEMGB], e.g. 4xH100-80GB",
                field="simulate_gpus")
        count, model = int(match.group(1) or 1), match.group(2).upper()
        memory_gib = int(match.group(3) or KNOWN_MEMORY.get(model, 16))
        if not 1 <= count <= 64 or len(gpus) + count > 64:
            raise InvalidArgument("simulate_gpus: at most 64 GPUs", field="simulate_gpus")
        for _ in range(count):
            index = len(gpus)
            gpus.append(Gpu(
                index=index, uuid=f"GPU-51a0{index:04x}-0000-4000-8000-{index:012x}",
                name=f"NVIDIA {model} {memory_gib}GB (simulated)",
                pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
                memory_total=memory_gib * 2**30, utilization=0, power_mw=0, energy_mj=0,
                numa_node=group))
            groups.append(group)
    if not gpus:
        raise InvalidArgument("simulate_gpus: no GPUs in the spec", field="simulate_gpus")
    n = len(gpus)
    levels = [[0 if i == j else NVLINK if groups[i] == groups[j] and i // 2 == j // 2
               else 30 if groups[i] == groups[j] else 50 for j in range(n)] for i in range(n)]
    return Inventory(gpus, "simulated", f"simulated: {spec}", levels, driver="simulated")
