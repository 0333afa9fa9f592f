"""The box's GPUs as the daemon sees them: one record per GPU (identity, memory, load,
processes, health), the links between them, and where the picture came from (NVML, a
simulation, or nothing). Stdlib only: the scheduler and the CLI read these too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# NVML topology levels, best first: same board, one PCIe switch, several switches,
# one host bridge, one NUMA node, across the system.
LEVEL_NAMES = {0: "board", 10: "PCIe switch", 20: "PCIe switches", 30: "host bridge",
               40: "NUMA node", 50: "system"}
NVLINK = -10  # ranks above every PCIe level
_DROP = re.compile(r"\b(NVIDIA|GeForce|Tesla|Quadro)\b", re.I)


def model_of(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-80GB" -> "A100",
    "NVIDIA GeForce RTX 4090" -> "RTX4090", "NVIDIA L4" -> "L4"."""
    text = _DROP.sub(" ", name).strip()
    text = re.sub(r"\b(RTX|GTX|TITAN)\s+", r"\1", text, flags=re.I)
    first = re.split(r"[\s-]+", text)[0] if text else name
    return first.upper()


@dataclass
class GpuProcess:
    pid: int
    used_memory: int | None
    user: str | None = None  # None: the pid is not visible here

    def to_wire(self) -> dict[str, Any]:
        return {"pid": self.pid, "used_memory": self.used_memory, "user": self.user}


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total: int
    memory_used: int = 0
    utilization: int | None = None
    power_mw: int | None = None
    energy_mj: int | None = None
    mig: bool = False
    numa_node: int | None = None
    processes: list[GpuProcess] = field(default_factory=list)
    healthy: bool = True
    problem: str | None = None  # why it is unhealthy
    fatal: bool = False  # broken for good (an Xid, gone from the bus): its work is lost
    minor: int | None = None  # its /dev/nvidiaN (NVML's minor number); None: its index
    # False: its load, memory and power were not read (NVML failed on it, or it is
    # simulated), so they are no measurement: the history records none for it.
    measured: bool = True

    @property
    def device_minor(self) -> int:
        """N of its node /dev/nvidiaN (major 195): NVML's minor number, else (a simulated
        GPU, or NVML without it) its index."""
        return self.index if self.minor is None else self.minor

    @property
    def model(self) -> str:
        return model_of(self.name)

    def to_wire(self) -> dict[str, Any]:
        return {
            "index": self.index, "uuid": self.uuid, "name": self.name, "model": self.model,
            "pci_bus_id": self.pci_bus_id, "memory_total": self.memory_total,
            "memory_used": self.memory_used, "utilization": self.utilization,
            "power_w": None if self.power_mw is None else self.power_mw / 1000,
            "energy_j": None if self.energy_mj is None else self.energy_mj / 1000,
            "mig": self.mig, "numa_node": self.numa_node, "healthy": self.healthy,
            "problem": self.problem, "processes": [p.to_wire() for p in self.processes],
        }


@dataclass
class Inventory:
    gpus: list[Gpu]
    source: str  # "nvml", "simulated" or "none"
    note: str = ""  # why there are none, or what was simulated
    # levels[i][j]: NVML topology level between GPU i and j (NVLINK when NVLinked)
    levels: list[list[int]] = field(default_factory=list)
    driver: str | None = None
    read_at: float = 0.0  # when NVML was read (0: never changes, as simulated)

    @property
    def simulated(self) -> bool:
        return self.source == "simulated"

    def by_uuid(self) -> dict[str, Gpu]:
        return {g.uuid: g for g in self.gpus}

    def link(self, a: int, b: int) -> int:
        if a == b:
            return 0
        try:
            return self.levels[a][b]
        except IndexError:
            return 50

    def summary(self) -> str:
        """"4 x H100 (80 GiB), 2 x L4 (22 GiB)", or why there are none."""
        if not self.gpus:
            return f"no GPUs ({self.note})" if self.note else "no GPUs"
        counts: dict[str, tuple[int, int]] = {}
        for gpu in self.gpus:
            n, mem = counts.get(gpu.model, (0, gpu.memory_total))
            counts[gpu.model] = (n + 1, min(mem, gpu.memory_total))
        return ", ".join(f"{n} x {model} ({mem / 2**30:.0f} GiB)"
                         for model, (n, mem) in counts.items())

    def to_wire(self) -> dict[str, Any]:
        return {"source": self.source, "simulated": self.simulated, "note": self.note,
                "driver": self.driver, "gpus": [g.to_wire() for g in self.gpus],
                "links": [[LEVEL_NAMES.get(v, "NVLink") if v != NVLINK else "NVLink"
                           for v in row] for row in self.levels]}


def job_env(gpus: list[Gpu], box_has_gpus: bool, in_container: bool,
            simulated: bool) -> dict[str, str]:
    """What a job learns of its GPUs. Host processes see only theirs through
    CUDA_VISIBLE_DEVICES (UUIDs, in PCI order); a container's are given by docker (and
    renumbered from 0 inside), except simulated ones, which exist only in this env."""
    env = {"NODUS_GPUS": json.dumps([{"index": g.index, "uuid": g.uuid, "model": g.model}
                                     for g in gpus])}
    if gpus and (not in_container or simulated):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    elif box_has_gpus and not in_container:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPUs asked for: none visible
    if in_container:
        # Over the image's and the job's own: with the NVIDIA runtime as docker's default,
        # an image's NVIDIA_VISIBLE_DEVICES=all would hand it every GPU on the box. A
        # simulated GPU is no real one: such a container gets none.
        env["NVIDIA_VISIBLE_DEVICES"] = ("void" if simulated
                                         else ",".join(g.uuid for g in gpus) or "void")
    return env
